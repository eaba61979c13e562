/**
 * The castor runtime child process: spawn, handshake, calls with deadlines, respawn.
 *
 * Guarantees:
 * - `call()` always settles within its timeout (spawn + handshake included), so a
 *   dead or hung runtime never hangs Pi;
 * - when the child exits, every call in flight fails with `runtime_exited` and the
 *   `onDown` listener runs once per runtime generation (unless we stopped it);
 * - after a death, `call(..., {spawn: true})` starts a fresh runtime (a new
 *   generation) and redoes the handshake; `spawn: false` fails fast instead;
 * - the child never outlives Pi's process (killed on exit).
 *
 * The command comes from a Pi flag or the CASTOR_COMMAND environment variable,
 * never from project files (project files must not choose what runs).
 */
import { spawn, type ChildProcess } from "node:child_process";
import { readFileSync, statSync } from "node:fs";
import { connect, type Socket } from "node:net";
import { castorEnv, endpointText, tokenFromFile, type Endpoint } from "./locate.ts";
import { ownerIsUs, tcpListenerOwner, unixListenerOwner, type ListenerOwner } from "./owner.ts";
import { MsgpackRpcPeer, RpcError, type Handler, type Params } from "./rpc.ts";

/** How long a child that exited may still take to hand over its last stderr bytes (see `open`). */
const STDERR_DRAIN_MS = 200;
/** How long a castor that is stopping gets to end the utility commands it runs before SIGKILL:
 * when the extension stops it, and when it closes its end on its own (a SIGTERM it was sent). */
const CASTOR_STOP_GRACE_MS = 2000;

export interface Hello {
	name?: string;
	version?: string;
	protocol?: number;
	capabilities?: string[];
	methods?: string[];
	[key: string]: unknown;
}

/** What the extension's casts and hooks need of castor: a castor whose hello announces methods
 * without one of these is older than the extension (the rest it uses only where announced). */
export const CORE_METHODS: readonly string[] = ["session.open", "harness.event", "agent.turn_ended", "cast.start"];

/** The `wanted` methods a castor's hello does not announce (none when it announces no list). */
export function missingMethods(hello: Hello | undefined, wanted: readonly string[] = CORE_METHODS): string[] {
	const methods = hello?.methods;
	return Array.isArray(methods) ? wanted.filter((method) => !methods.includes(method)) : [];
}

/** What to tell the user of a castor that lacks `missing` methods: it is older than the extension, and how to upgrade. */
export function olderCastorText(hello: Hello | undefined, extensionVersion: string, missing: readonly string[]): string {
	return `castor ${hello?.version ?? "?"} is older than this extension (${extensionVersion}): it has no ${missing.join(", ")}. ` +
		"Upgrade castor (pip install -U castor, in the Python that runs it) or point --castor-python / --castor-command at a newer one";
}

/**
 * What to tell the user of a started command that exited before answering castor's handshake: it
 * is not castor (a `castor` on PATH that is something else) or a castor without `serve --stdio`,
 * and how to point at a working one. The failed call carries it as its data's `next`, told after
 * castor's last stderr lines (those, when there are any, say best why it exited).
 */
export function notCastorText(command: string): string {
	return `${command} exited before answering its handshake: it is not castor serve --stdio, or a castor too old to run it. ` +
		"Install or upgrade castor (pip install -U castor) or start Pi with --castor-python <python that has castor> or --castor-command.";
}

/** The next step an error names for the user (its data's `next`), as " <text>"; else "". */
export function nextStepText(err: unknown): string {
	const next = err instanceof RpcError ? (err.data as { next?: unknown } | undefined)?.next : undefined;
	return typeof next === "string" && next ? ` ${next}` : "";
}

export interface RuntimeOptions {
	/** The child to spawn (`castor serve --stdio`), unless `endpoint` is given. */
	command: string[];
	/** Connect to an already running castor instead of spawning one; it is never stopped by Pi. */
	endpoint?: Endpoint;
	/** A file holding the endpoint's token, presented as `runtime.hello` `token` (read at each connect). */
	tokenFile?: string;
	cwd: string;
	timeoutMs: number;
	/** castor went silent (`true`: a deadline passed with nothing heard) or spoke again (`false`). */
	onSilence?: (silent: boolean) => void;
	helloParams: Params;
	handlers: Record<string, Handler>;
	log: (msg: string) => void;
	/** Where the child's stderr goes, as it comes (stderr.ts); without it the child inherits Pi's. */
	stderr?: (text: string) => void;
	/** Whether a runtime may be started now (false: the session it would serve is ending). */
	mayStart?: () => boolean;
	onUp: (hello: Hello, generation: number) => void;
	onDown: (reason: string, generation: number) => void;
}

/**
 * Whether a `session_start` opens the session on castor again: yes for a new or replaced session
 * (another id), an unknown id (""), or one shut down since. The same known session started again
 * is open already: a second `session.open` of it on the connection is refused (`conflict`), which
 * showed as "castor runtime unavailable" with the footer `castor: down`; its start goes to castor
 * as an event, which runs the Icarus startup once per known session id.
 */
export function opensOnStart(previousId: string, id: string, shutDownSince: boolean): boolean {
	return shutDownSince || id === "" || id !== previousId;
}

/** A Pi session as castor knows it: `castorId` routes castor's calls; `harnessId` is Pi's own id. */
export interface SessionIds {
	castorId: string;
	harnessId: string;
}

/**
 * The ids for a `session_start`. castor routes by a non-empty id; a Pi session without one (Pi gave
 * "") is opened under `newId()` and tells castor its own id is "" (`flags.harness_session_id`), so
 * the memory hooks get `session_id ""` as pi-icarus-hook's did. That id is kept while the session
 * lasts (a repeated start is the same session: castor then runs its startup again, an empty id
 * naming no session) and a new one is made after a shutdown.
 */
export function sessionIds(piId: string, current: SessionIds, shutDownSince: boolean, newId: () => string): SessionIds {
	if (piId) return { castorId: piId, harnessId: piId };
	if (current.castorId && current.harnessId === "" && !shutDownSince) return current;
	return { castorId: newId(), harnessId: "" };
}

/** Split a command line: a JSON array, or words separated by spaces with '…'/"…" quoting. */
export function parseCommand(text: string): string[] {
	const trimmed = text.trim();
	if (trimmed.startsWith("[")) {
		const parsed = JSON.parse(trimmed);
		if (!Array.isArray(parsed) || parsed.length === 0 || !parsed.every((p) => typeof p === "string")) {
			throw new Error("castor command JSON must be a non-empty array of strings");
		}
		return parsed;
	}
	const words: string[] = [];
	const re = /"([^"]*)"|'([^']*)'|(\S+)/g;
	for (let m = re.exec(trimmed); m; m = re.exec(trimmed)) words.push(m[1] ?? m[2] ?? m[3]);
	if (words.length === 0) throw new Error("castor command is empty");
	return words;
}

/** How long a TCP connection's listener side gets to appear in the kernel's table (see owner.ts). */
const OWNER_SETTLE_MS = 200;

/** Refuse a listener of another user (root aside): it would hear the token and the whole session. */
async function checkListener(endpoint: Endpoint, socket?: Socket): Promise<void> {
	let owner: ListenerOwner;
	if (endpoint.kind === "unix") {
		owner = unixListenerOwner(endpoint.path);
		if (owner !== undefined && "gone" in owner) return; // nothing there: the connect says it cannot reach castor
	} else {
		const deadline = Date.now() + OWNER_SETTLE_MS;
		owner = tcpListenerOwner(socket!);
		while (owner !== undefined && "gone" in owner && Date.now() < deadline) {
			await new Promise((r) => setTimeout(r, 5));
			owner = tcpListenerOwner(socket!);
		}
	}
	if (ownerIsUs(owner)) return;
	const who = owner !== undefined && "uid" in owner ? `another user (uid ${owner.uid})` : "nobody castor can name";
	throw new RpcError("forbidden", `refusing to talk to castor at ${endpointText(endpoint)}: ${who} listens there, not your castor serve`, {
		reason: "peer_uid",
	});
}

/** Connect a stream socket to `endpoint` within `timeoutMs`, once its listener is known to be this user's. */
async function connectEndpoint(endpoint: Endpoint, timeoutMs: number): Promise<Socket> {
	if (endpoint.kind === "unix") await checkListener(endpoint);
	const socket = await connectSocket(endpoint, timeoutMs);
	if (endpoint.kind === "tcp") {
		try {
			await checkListener(endpoint, socket);
		} catch (err) {
			socket.destroy();
			throw err;
		}
	}
	return socket;
}

function connectSocket(endpoint: Endpoint, timeoutMs: number): Promise<Socket> {
	return new Promise((resolve, reject) => {
		const socket = endpoint.kind === "unix" ? connect({ path: endpoint.path }) : connect({ host: endpoint.host, port: endpoint.port });
		const timer = setTimeout(() => {
			socket.destroy();
			reject(new RpcError("timeout", `cannot reach castor at ${endpointText(endpoint)} within ${timeoutMs} ms`));
		}, timeoutMs);
		socket.once("connect", () => {
			clearTimeout(timer);
			resolve(socket);
		});
		socket.once("error", (err) => {
			clearTimeout(timer);
			socket.destroy();
			reject(new RpcError("runtime_unreachable", `cannot reach castor at ${endpointText(endpoint)}: ${err.message}`));
		});
	});
}

/** The token a token file holds (see {@link tokenFromFile}); a file that cannot be read is an error. */
export function readToken(file: string): string {
	let text: string;
	let mode: number;
	try {
		mode = statSync(file).mode;
		text = readFileSync(file, "utf8");
	} catch (err) {
		throw new RpcError("invalid_config", `cannot read --castor-token-file ${file}: ${err instanceof Error ? err.message : String(err)}`);
	}
	try {
		return tokenFromFile(text, mode, file);
	} catch (err) {
		throw new RpcError("invalid_config", err instanceof Error ? err.message : String(err));
	}
}

export class CastorRuntime {
	private child: ChildProcess | undefined;
	private socket: Socket | undefined;
	private peer: MsgpackRpcPeer | undefined;
	private starting: Promise<MsgpackRpcPeer> | undefined;
	private stopping = false;
	/** A stop under way (`stop()`), until the runtime it stops has gone: nothing starts meanwhile. */
	private stopped: Promise<void> | undefined;
	generation = 0;
	hello: Hello | undefined;
	/** false after an unexpected death: lifecycle events then stop respawning until a command does. */
	autoSpawn = true;

	private readonly opts: RuntimeOptions;

	constructor(opts: RuntimeOptions) {
		this.opts = opts;
	}

	get pid(): number | undefined {
		return this.peer && !this.peer.isClosed ? this.child?.pid : undefined;
	}

	/** Where castor runs: the endpoint connected to, or undefined for a child on stdio. */
	get endpoint(): string | undefined {
		return this.opts.endpoint ? endpointText(this.opts.endpoint) : undefined;
	}

	get isUp(): boolean {
		return this.peer !== undefined && !this.peer.isClosed && this.hello !== undefined;
	}

	/** Up, but a call's deadline passed with nothing heard from castor since it was sent (stopped,
	 * wedged); false again as soon as anything comes from it. */
	get silent(): boolean {
		return this.isUp && this.peer!.silent;
	}

	/** Whether castor answers a cheap request (its hello) within `timeoutMs`: what a status shows,
	 * and what decides whether a silent castor is asked again or skipped. */
	async probe(timeoutMs: number): Promise<boolean> {
		const peer = this.peer;
		if (!this.isUp || !peer) return false;
		try {
			await peer.request("runtime.hello", this.opts.helloParams, timeoutMs);
			return true;
		} catch {
			return false;
		}
	}

	/** Whether the runtime announced `method` (true when it announced no list at all). */
	has(method: string): boolean {
		const methods = this.hello?.methods;
		return !Array.isArray(methods) || methods.includes(method);
	}

	/** `marksSilence: false`: a best-effort ask on a short deadline, whose passing says castor is
	 * busy, not that it stopped (see `MsgpackRpcPeer.request`). */
	async call(method: string, params: Params,
		options: { timeoutMs?: number; spawn?: boolean; marksSilence?: boolean } = {}): Promise<unknown> {
		const timeoutMs = options.timeoutMs ?? this.opts.timeoutMs;
		const peer = await this.ensure(options.spawn ?? this.autoSpawn, timeoutMs);
		return peer.request(method, params, timeoutMs, { marksSilence: options.marksSilence ?? true });
	}

	notify(method: string, params: Params): void {
		if (this.isUp) this.peer?.notify(method, params);
	}

	/** Start (or reuse) the runtime and finish the handshake, within `timeoutMs`. */
	async ensure(spawnIfDown = true, timeoutMs = this.opts.timeoutMs): Promise<MsgpackRpcPeer> {
		if (this.peer && !this.peer.isClosed && this.hello) return this.peer;
		if (this.starting) return this.starting;
		// A call that comes while the runtime is being stopped (a hook of the run during /castor
		// restart) waits for the stop to end -- at most its grace -- and then gets the next runtime.
		// It used to start that one at once, which made the one stopping this generation's past and
		// SIGKILLed it without the grace in which it ends the utility commands its casts run.
		if (this.stopped) {
			await this.stopped;
			return this.ensure(spawnIfDown, timeoutMs);
		}
		if (!spawnIfDown) throw new RpcError("runtime_exited", "castor runtime is not running (use a /materia, /icarus or /castor command to restart it)");
		// Checked here, after any wait for a stop: a call that waited out the stop of a session's end
		// must not start a castor for the session that ended.
		if (this.opts.mayStart && !this.opts.mayStart()) throw new RpcError("runtime_exited", "the session is ending: no castor is started for it");
		this.starting = this.start(timeoutMs).finally(() => {
			this.starting = undefined;
		});
		return this.starting;
	}

	/** Spawn the child (stdio) or connect to the endpoint; the peer over it. */
	private async open(generation: number, timeoutMs: number): Promise<{ peer: MsgpackRpcPeer; release: (graceMs?: number) => void }> {
		const log = (m: string) => this.opts.log(`[castor#${generation}] ${m}`);
		if (this.opts.endpoint) {
			const socket = await connectEndpoint(this.opts.endpoint, timeoutMs);
			this.socket = socket;
			this.child = undefined;
			const peer = new MsgpackRpcPeer(socket, socket, log);
			socket.once("error", (err) => peer.close(`connection to ${endpointText(this.opts.endpoint!)} failed: ${err.message}`));
			socket.once("close", () => peer.close(`connection to ${endpointText(this.opts.endpoint!)} closed`));
			return { peer, release: () => socket.destroy() };
		}
		const [cmd, ...args] = this.opts.command;
		const sink = this.opts.stderr;
		const child = spawn(cmd!, args, { cwd: this.opts.cwd, stdio: ["pipe", "pipe", sink ? "pipe" : "inherit"], env: castorEnv(process.env) });
		this.child = child;
		// The child never outlives Pi's process. The listener goes with the child: Pi loads the
		// extension afresh for every session it replaces (/new, /resume, /fork, /reload), so one
		// per runtime made would pile up on Pi's process (Node warns from the 11th, on Pi's screen).
		const killOnExit = () => child.kill("SIGKILL");
		process.once("exit", killOnExit);
		child.once("exit", () => process.removeListener("exit", killOnExit));
		child.once("error", () => process.removeListener("exit", killOnExit));
		if (sink && child.stderr) {
			child.stderr.setEncoding("utf8");
			child.stderr.on("data", (text: string) => sink(text)); // always read: a full pipe would stall castor
		}
		this.socket = undefined;
		const peer = new MsgpackRpcPeer(child.stdout!, child.stdin!, log);
		child.once("error", (err) => peer.close(`cannot start ${cmd}: ${err.message}`));
		child.once("exit", (code, signal) => {
			const reason = signal ? `killed by ${signal}` : `exit code ${code}`;
			// Node may tell the exit before the child's last stderr bytes are read; the notice of a
			// runtime that failed is built at the close, and those lines are its only clue (a
			// traceback). Closed once they are in -- or after STDERR_DRAIN_MS, should something the
			// child started keep its stderr open.
			const err = sink ? child.stderr : null;
			if (!err || err.readableEnded || err.destroyed) {
				peer.close(reason);
				return;
			}
			const close = () => {
				clearTimeout(timer);
				peer.close(reason);
			};
			const timer = setTimeout(close, STDERR_DRAIN_MS);
			err.once("end", close);
			err.once("close", close);
		});
		return {
			peer,
			// With a grace, the child is SIGKILLed only if it has not exited by then: a castor that
			// closed its end because it is shutting down (a SIGTERM of its own) ends the utility
			// commands it runs first -- killed at once, it left them running with no owner.
			release: (graceMs = 0) => {
				if (child.exitCode !== null || child.signalCode !== null) return;
				if (graceMs <= 0) {
					child.kill("SIGKILL");
					return;
				}
				const timer = setTimeout(() => {
					if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
				}, graceMs);
				timer.unref();
				child.once("exit", () => clearTimeout(timer));
			},
		};
	}

	private async start(timeoutMs: number): Promise<MsgpackRpcPeer> {
		const generation = ++this.generation;
		this.hello = undefined;
		this.stopping = false;
		const helloParams = this.opts.tokenFile ? { ...this.opts.helloParams, token: readToken(this.opts.tokenFile) } : this.opts.helloParams;
		const { peer, release } = await this.open(generation, timeoutMs);
		this.peer = peer;
		for (const [name, handler] of Object.entries(this.opts.handlers)) peer.on(name, handler);
		peer.onSilence((silent) => {
			if (generation === this.generation && this.hello !== undefined) this.opts.onSilence?.(silent);
		});
		peer.onClose((reason) => {
			// Stopping: castor closes its end as it begins to shut down (stdin EOF), and must get
			// the grace stop() gives it (SIGKILL only after that) to end the utility commands it
			// runs -- killed at once, they went on after Pi was gone and a continue ran them again.
			if (this.stopping && generation === this.generation) return;
			// A runtime that was up may be shutting down on its own (SIGTERM): the same grace as stop().
			release(this.hello !== undefined && generation === this.generation ? CASTOR_STOP_GRACE_MS : 0);
			if (this.stopping || generation !== this.generation) return;
			const wasUp = this.hello !== undefined;
			this.hello = undefined;
			// A runtime that never finished its handshake is reported by the failing call itself.
			if (!wasUp) return;
			this.autoSpawn = false;
			this.opts.onDown(reason, generation);
		});
		try {
			const hello = (await peer.request("runtime.hello", helloParams, timeoutMs)) as Hello;
			if (hello === null || typeof hello !== "object") throw new RpcError("invalid_frame", "runtime.hello returned no map");
			this.hello = hello;
		} catch (err) {
			this.stopping = true;
			peer.close("handshake failed");
			release(); // no grace for a runtime that never answered its handshake
			if (err instanceof RpcError && err.code === "runtime_exited" && !this.opts.endpoint) {
				throw new RpcError(err.code, err.message, { next: notCastorText(this.opts.command[0] ?? "castor") });
			}
			throw err instanceof RpcError ? err : new RpcError("internal", String(err));
		}
		this.autoSpawn = true;
		this.opts.onUp(this.hello, generation);
		return peer;
	}

	/** Close stdin (castor exits on EOF), SIGKILL after `graceMs`; for an endpoint, disconnect only.
	 * Until it has gone, `ensure` starts no other runtime (see there). */
	stop(graceMs = CASTOR_STOP_GRACE_MS): Promise<void> {
		const done = this.stopNow(graceMs);
		this.stopped = done;
		void done.finally(() => {
			if (this.stopped === done) this.stopped = undefined;
		});
		return done;
	}

	private stopNow(graceMs: number): Promise<void> {
		const child = this.child;
		// A runtime still starting (no handshake answered yet) runs no cast to wind down: no grace, as
		// for one whose handshake failed -- Pi quitting while castor started waited the grace out.
		if (this.starting && this.hello === undefined) graceMs = 0;
		this.stopping = true;
		this.hello = undefined;
		const socket = this.socket;
		if (socket) {
			this.socket = undefined;
			return new Promise((resolve) => {
				const timer = setTimeout(() => {
					socket.destroy();
					resolve();
				}, graceMs);
				socket.once("close", () => {
					clearTimeout(timer);
					resolve();
				});
				socket.end();
			});
		}
		if (!child || child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
		return new Promise((resolve) => {
			const timer = setTimeout(() => child.kill("SIGKILL"), graceMs);
			child.once("exit", () => {
				clearTimeout(timer);
				resolve();
			});
			child.stdin?.end();
		});
	}
}
