import assert from "node:assert/strict";
import { test } from "node:test";
import { CastorRuntime } from "../src/runtime.ts";

/** A runtime whose child is a Node process running `script`: by default one that reads its stdin and
 * never answers (it ends at EOF). */
function silentChild(script = "process.stdin.resume(); process.stdin.on('end', () => process.exit(0))", timeoutMs = 200): CastorRuntime {
	return new CastorRuntime({
		command: [process.execPath, "-e", script],
		cwd: process.cwd(),
		timeoutMs,
		helloParams: { client: "runtime-test" },
		handlers: {},
		log: () => {},
		stderr: () => {},
		onUp: () => {},
		onDown: () => {},
	});
}

test("runtimes made and stopped leave no listener on Pi's process (one per session replacement piled up)", { timeout: 20_000 }, async () => {
	// Pi loads the extension afresh for every session it replaces, so each session makes a runtime.
	// Each used to add an "exit" listener to Pi's process for good: from the 11th, Node printed a
	// MaxListenersExceededWarning on Pi's screen.
	const before = process.listenerCount("exit");
	for (let i = 0; i < 12; i++) {
		const rt = silentChild();
		await assert.rejects(rt.ensure(true)); // its child is started, never answers the handshake, is killed
		await rt.stop();
	}
	const deadline = Date.now() + 5_000;
	while (process.listenerCount("exit") !== before && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
	assert.equal(process.listenerCount("exit"), before);
});

test("a runtime's child is still killed when Pi's process exits while it runs", { timeout: 20_000 }, async () => {
	const before = process.listenerCount("exit");
	const rt = silentChild();
	const started = rt.ensure(true).catch(() => undefined);
	assert.equal(process.listenerCount("exit"), before + 1, "the child is covered while it runs");
	await started;
	await rt.stop();
});

test("a castor whose hello lacks a core method is named older than the extension, with how to upgrade", async () => {
	const { missingMethods, olderCastorText, CORE_METHODS } = await import("../src/runtime.ts");
	assert.deepEqual(missingMethods({ version: "0.0.1", methods: ["runtime.hello", "cast.start"] }),
		CORE_METHODS.filter((m) => m !== "cast.start"));
	assert.deepEqual(missingMethods({ methods: [...CORE_METHODS, "cast.list"] }), []);
	assert.deepEqual(missingMethods({ version: "9" }), [], "no list announced: nothing is assumed missing");
	const text = olderCastorText({ version: "0.0.1" }, "0.1.0", ["cast.list"]);
	assert.match(text, /^castor 0\.0\.1 is older than this extension \(0\.1\.0\): it has no cast\.list\. /);
	assert.match(text, /pip install -U castor/);
	assert.match(text, /--castor-python/);
});

test("a child that exits before its handshake (not castor, or too old) is named, with what to check and how to fix it", { timeout: 20_000 }, async () => {
	// A `castor` on PATH that is something else, or one without `serve --stdio`, printed junk and
	// exited 1: the user read only "castor runtime exited during runtime.hello (write EPIPE)".
	const rt = silentChild("process.stdout.write('junk\\n'); process.exit(1)", 5_000);
	const err = await rt.ensure(true).then(() => undefined, (e: unknown) => e as { code?: string; message?: string });
	await rt.stop();
	assert.ok(err, "the handshake fails");
	assert.equal(err.code, "runtime_exited");
	const { nextStepText } = await import("../src/runtime.ts");
	const next = nextStepText(err);
	assert.ok(next.startsWith(` ${process.execPath} exited before answering its handshake: it is not castor serve --stdio`), next);
	assert.match(next, /pip install -U castor/);
	assert.match(next, /--castor-python/);
});

test("a call while the runtime is being stopped waits for the stop: the runtime stopping keeps its grace", { timeout: 20_000 }, async () => {
	// /castor restart stops castor (stdin closed, SIGKILL only after a grace in which castor ends the
	// utility commands its casts run) and then starts the next one. A hook calling castor meanwhile
	// used to start the next one at once, and the one stopping was SIGKILLed at that moment.
	const { mkdtempSync, existsSync } = await import("node:fs");
	const { tmpdir } = await import("node:os");
	const { join } = await import("node:path");
	const dir = mkdtempSync(join(tmpdir(), "castor-rt-"));
	// A castor that answers its handshake and, at the end of its input, takes 400 ms to wind down.
	const script = `
		const { Encoder, decodeMultiStream } = require("@msgpack/msgpack");
		const fs = require("node:fs");
		const enc = new Encoder();
		process.stdin.on("end", () => setTimeout(() => { fs.writeFileSync(${JSON.stringify(join(dir, "ended-"))} + process.pid, ""); process.exit(0); }, 400));
		(async () => {
			for await (const frame of decodeMultiStream(process.stdin)) {
				if (frame[0] === 0) process.stdout.write(enc.encode([1, frame[1], null, { name: "castor", version: "test" }]));
			}
		})();`;
	const rt = silentChild(script, 5_000);
	await rt.ensure(true);
	const first = rt.pid;
	assert.ok(first);
	const stopping = rt.stop();
	try {
		await rt.ensure(true); // the hook's call
		assert.ok(existsSync(join(dir, `ended-${first}`)), "the runtime stopping was killed before it wound down");
		assert.notEqual(rt.pid, first, "the call got the next runtime");
	} finally {
		await stopping;
		await rt.stop(0);
	}
});

test("a call that waits out a stop starts no runtime when none may start any more (the session ended meanwhile)", { timeout: 20_000 }, async () => {
	let may = true;
	// A castor that answers its handshake and, at the end of its input, takes 300 ms to wind down.
	const script = `
		const { Encoder, decodeMultiStream } = require("@msgpack/msgpack");
		const enc = new Encoder();
		process.stdin.on("end", () => setTimeout(() => process.exit(0), 300));
		(async () => {
			for await (const frame of decodeMultiStream(process.stdin)) {
				if (frame[0] === 0) process.stdout.write(enc.encode([1, frame[1], null, { name: "castor", version: "test" }]));
			}
		})();`;
	const rt = new CastorRuntime({
		command: [process.execPath, "-e", script],
		cwd: process.cwd(),
		timeoutMs: 5_000,
		helloParams: { client: "runtime-test" },
		handlers: {},
		log: () => {},
		stderr: () => {},
		mayStart: () => may,
		onUp: () => {},
		onDown: () => {},
	});
	await rt.ensure(true);
	const before = process.listenerCount("exit");
	const stopping = rt.stop();
	may = false; // the session ends while the stop goes on
	const err = await rt.ensure(true).then(() => undefined, (e: unknown) => e as { code?: string; message?: string });
	await stopping;
	try {
		assert.equal(err?.code, "runtime_exited");
		assert.match(String(err?.message), /session is ending/);
		assert.equal(rt.isUp, false);
	} finally {
		await rt.stop(0);
	}
	assert.ok(process.listenerCount("exit") <= before, "no runtime was started after the stop");
});
