/**
 * Which castor to start (pure: the caller passes the flags, the environment and a file test).
 *
 * | first that is set                                   | command                                  |
 * |-----------------------------------------------------|------------------------------------------|
 * | flag `--castor-command` / env `CASTOR_COMMAND`      | that command line (JSON array or words)  |
 * | flag `--castor-python` / env `CASTOR_PYTHON`        | `<python> -P -m castor serve --stdio`    |
 * | an executable `castor` in a `PATH` directory        | `<that file> serve --stdio`              |
 * | none of these                                       | error: how to install castor or point at it |
 *
 * Only Pi flags and the environment are read, never project files: a checkout cannot choose
 * what runs. A `--castor-python` that is not an absolute path is looked up on `PATH` like a
 * command (`python3` works); one that names no executable file is an error, not a fallback.
 *
 * castor starts in the project's directory, which the project's own files fill: nothing there may
 * be imported in castor's place before the project is trusted. `-m` puts the current directory
 * first on Python's import path (a project's `loguru.py` or `castor/` ran as castor), so the
 * interpreter gets `-P`, which leaves it off; and an empty or relative `PYTHONPATH` entry (`:/x`,
 * a common shell habit) means the current directory too, so castor's environment keeps only the
 * absolute entries (`castorEnv`).
 */
import { parseCommand } from "./runtime.ts";

export interface LocateInput {
	command?: string;
	python?: string;
	/** The `PATH` value to search. */
	path?: string;
	/** Whether `file` is an executable regular file. */
	isExecutable: (file: string) => boolean;
}

export interface Located {
	argv: string[];
	/** Where the choice came from, for the status line and errors. */
	source: "castor-command" | "castor-python" | "path";
}

export const SERVE_ARGS = ["serve", "--stdio"];

export class LocateError extends Error {
	override readonly name = "LocateError";
}

/** The directories of a `PATH` value (empty entries mean the current directory, which is skipped). */
export function pathDirs(path: string | undefined): string[] {
	return (path ?? "").split(":").filter((d) => d.length > 0 && d.startsWith("/"));
}

/** The first executable `name` on `path`, or undefined. `name` with a slash is taken as given. */
export function which(name: string, path: string | undefined, isExecutable: (file: string) => boolean): string | undefined {
	if (name.includes("/")) return isExecutable(name) ? name : undefined;
	for (const dir of pathDirs(path)) {
		const file = `${dir.replace(/\/+$/, "")}/${name}`;
		if (isExecutable(file)) return file;
	}
	return undefined;
}

export function locateCastor(input: LocateInput): Located {
	const command = input.command?.trim();
	if (command) return { argv: parseCommand(command), source: "castor-command" };
	const python = input.python?.trim();
	if (python) {
		const exe = which(python, input.path, input.isExecutable);
		if (!exe) throw new LocateError(`--castor-python ${python} is not an executable file (nor a command on PATH)`);
		return { argv: [exe, "-P", "-m", "castor", ...SERVE_ARGS], source: "castor-python" };
	}
	const castor = which("castor", input.path, input.isExecutable);
	if (castor) return { argv: [castor, ...SERVE_ARGS], source: "path" };
	throw new LocateError(
		"castor is not on PATH: install it (pip install castor) or start Pi with --castor-python <python that has castor> " +
			"or --castor-command '<command that runs castor serve --stdio>'",
	);
}

/** The environment castor starts with: `env` with only the absolute entries of `PYTHONPATH` (an
 * empty or relative one names the current directory, the project's, whose files must not be
 * imported before it is trusted; see the module doc). The variable goes when nothing is left. */
export function castorEnv(env: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
	const value = env.PYTHONPATH;
	if (value === undefined) return env;
	const kept = value.split(":").filter((entry) => entry.startsWith("/"));
	if (kept.join(":") === value) return env;
	const out: NodeJS.ProcessEnv = { ...env };
	if (kept.length) out.PYTHONPATH = kept.join(":");
	else delete out.PYTHONPATH;
	return out;
}

/** An already running castor endpoint (`castor serve --socket PATH | --tcp HOST:PORT`). */
export type Endpoint = { kind: "unix"; path: string } | { kind: "tcp"; host: string; port: number };

/** `unix:/abs/path` or `tcp:HOST:PORT` (`tcp:[::1]:PORT` for IPv6); anything else is a LocateError. */
export function parseEndpoint(text: string): Endpoint {
	const value = text.trim();
	if (value.startsWith("unix:")) {
		const path = value.slice("unix:".length);
		if (!path.startsWith("/")) throw new LocateError(`--castor-endpoint ${value}: a Unix socket path must be absolute`);
		return { kind: "unix", path };
	}
	if (value.startsWith("tcp:")) {
		const rest = value.slice("tcp:".length);
		const colon = rest.lastIndexOf(":");
		const rawHost = colon > 0 ? rest.slice(0, colon) : "";
		const host = rawHost.startsWith("[") && rawHost.endsWith("]") ? rawHost.slice(1, -1) : rawHost;
		const portText = colon > 0 ? rest.slice(colon + 1) : "";
		const port = /^[0-9]{1,5}$/.test(portText) ? Number(portText) : Number.NaN;
		if (!host || host.includes("[") || !(port >= 1 && port <= 65535)) {
			throw new LocateError(`--castor-endpoint ${value}: expected tcp:HOST:PORT with a port from 1 to 65535`);
		}
		return { kind: "tcp", host, port };
	}
	throw new LocateError(`--castor-endpoint ${value}: expected unix:PATH or tcp:HOST:PORT`);
}

/** An endpoint as the status line and errors show it. */
export function endpointText(endpoint: Endpoint): string {
	return endpoint.kind === "unix" ? `unix:${endpoint.path}` : `tcp:${endpoint.host.includes(":") ? `[${endpoint.host}]` : endpoint.host}:${endpoint.port}`;
}

/**
 * The token in a token file's text (surrounding whitespace dropped). A file that group or others
 * may read is refused (`mode` is its permission bits): castor writes its token 0600, and a token
 * others can read authenticates them too.
 */
export function tokenFromFile(text: string, mode: number, file: string): string {
	if ((mode & 0o077) !== 0) {
		throw new LocateError(`--castor-token-file ${file} is readable by others (mode ${(mode & 0o777).toString(8)}): chmod 600 it`);
	}
	const token = text.trim();
	if (!token) throw new LocateError(`--castor-token-file ${file} is empty`);
	if (/\s/.test(token)) throw new LocateError(`--castor-token-file ${file} holds more than one word`);
	return token;
}
