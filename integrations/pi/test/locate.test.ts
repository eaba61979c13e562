import assert from "node:assert/strict";
import { test } from "node:test";
import { LocateError, castorEnv, endpointText, locateCastor, parseEndpoint, pathDirs, tokenFromFile, which } from "../src/locate.ts";

const files = (...names: string[]) => (file: string) => names.includes(file);

test("--castor-command wins, as a JSON array or words", () => {
	assert.deepEqual(locateCastor({ command: '["/v/bin/python","-m","castor","serve","--stdio"]', python: "/x", path: "/bin", isExecutable: files() }), {
		argv: ["/v/bin/python", "-m", "castor", "serve", "--stdio"],
		source: "castor-command",
	});
	assert.deepEqual(locateCastor({ command: "castor serve --stdio --log-level 'DEBUG'", isExecutable: files() }).argv, ["castor", "serve", "--stdio", "--log-level", "DEBUG"]);
});

test("--castor-python runs python -P -m castor (the project's directory is not on its import path); a bare name is looked up on PATH", () => {
	assert.deepEqual(locateCastor({ python: "/venv/bin/python", path: "/usr/bin", isExecutable: files("/venv/bin/python", "/usr/bin/castor") }), {
		argv: ["/venv/bin/python", "-P", "-m", "castor", "serve", "--stdio"],
		source: "castor-python",
	});
	assert.deepEqual(locateCastor({ python: "python3", path: "/opt/py/bin:/usr/bin", isExecutable: files("/usr/bin/python3") }).argv[0], "/usr/bin/python3");
});

test("a --castor-python that is no executable is an error, never a fallback to PATH", () => {
	assert.throws(() => locateCastor({ python: "/nope/python", path: "/usr/bin", isExecutable: files("/usr/bin/castor") }), LocateError);
});

test("default: castor on PATH, first directory that has it", () => {
	assert.deepEqual(locateCastor({ path: "/a:/b:/c", isExecutable: files("/b/castor", "/c/castor") }), { argv: ["/b/castor", "serve", "--stdio"], source: "path" });
});

test("nothing found: an error that says how to fix it", () => {
	assert.throws(() => locateCastor({ path: "/a", isExecutable: files() }), /castor is not on PATH: .*--castor-python/);
	assert.throws(() => locateCastor({ path: undefined, isExecutable: files() }), LocateError);
});

test("relative and empty PATH entries are skipped (the project directory never supplies castor)", () => {
	assert.deepEqual(pathDirs("::bin:./x:/usr/bin:"), ["/usr/bin"]);
	assert.equal(which("castor", ".:bin", files("./castor", "bin/castor")), undefined);
});

test("endpoints: unix:ABSOLUTE, tcp:HOST:PORT, tcp:[v6]:PORT", () => {
	assert.deepEqual(parseEndpoint("unix:/run/castor.sock"), { kind: "unix", path: "/run/castor.sock" });
	assert.deepEqual(parseEndpoint(" tcp:127.0.0.1:7070 "), { kind: "tcp", host: "127.0.0.1", port: 7070 });
	assert.deepEqual(parseEndpoint("tcp:[::1]:7070"), { kind: "tcp", host: "::1", port: 7070 });
	assert.equal(endpointText(parseEndpoint("tcp:[::1]:7070")), "tcp:[::1]:7070");
	assert.equal(endpointText(parseEndpoint("unix:/x")), "unix:/x");
});

test("bad endpoints are errors that name the expected forms", () => {
	for (const bad of ["unix:relative.sock", "tcp:host", "tcp::7070", "tcp:h:0", "tcp:h:65536", "tcp:h:12a", "http://x", "", "tcp:[::1:7"]) {
		assert.throws(() => parseEndpoint(bad), LocateError, bad);
	}
	assert.throws(() => parseEndpoint("sock"), /expected unix:PATH or tcp:HOST:PORT/);
});

test("token files: one word, owner-only", () => {
	assert.equal(tokenFromFile("  s3cr3t\n", 0o100600, "/t"), "s3cr3t");
	assert.throws(() => tokenFromFile("s3cr3t", 0o100644, "/t"), /readable by others \(mode 644\): chmod 600/);
	assert.throws(() => tokenFromFile("s3cr3t", 0o100640, "/t"), LocateError);
	assert.throws(() => tokenFromFile(" \n", 0o100600, "/t"), /is empty/);
	assert.throws(() => tokenFromFile("a b", 0o100600, "/t"), /more than one word/);
});

test("castor's environment keeps only PYTHONPATH's absolute entries: an empty or relative one is the project's directory", () => {
	assert.equal(castorEnv({ PYTHONPATH: ":/repo::lib:/x/" }).PYTHONPATH, "/repo:/x/");
	assert.equal("PYTHONPATH" in castorEnv({ PYTHONPATH: ":." , HOME: "/h" }), false);
	assert.equal(castorEnv({ PYTHONPATH: ":." , HOME: "/h" }).HOME, "/h");
	const unchanged = { PYTHONPATH: "/a:/b", PATH: "/bin" };
	assert.equal(castorEnv(unchanged), unchanged);
	assert.deepEqual(castorEnv({ PATH: "/bin" }), { PATH: "/bin" });
});
