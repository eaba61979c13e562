import assert from "node:assert/strict";
import { test } from "node:test";
import { LocateError, locateCastor, pathDirs, which } from "../src/locate.ts";

const files = (...names: string[]) => (file: string) => names.includes(file);

test("--castor-command wins, as a JSON array or words", () => {
	assert.deepEqual(locateCastor({ command: '["/v/bin/python","-m","castor","serve","--stdio"]', python: "/x", path: "/bin", isExecutable: files() }), {
		argv: ["/v/bin/python", "-m", "castor", "serve", "--stdio"],
		source: "castor-command",
	});
	assert.deepEqual(locateCastor({ command: "castor serve --stdio --log-level 'DEBUG'", isExecutable: files() }).argv, ["castor", "serve", "--stdio", "--log-level", "DEBUG"]);
});

test("--castor-python runs python -m castor; a bare name is looked up on PATH", () => {
	assert.deepEqual(locateCastor({ python: "/venv/bin/python", path: "/usr/bin", isExecutable: files("/venv/bin/python", "/usr/bin/castor") }), {
		argv: ["/venv/bin/python", "-m", "castor", "serve", "--stdio"],
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
