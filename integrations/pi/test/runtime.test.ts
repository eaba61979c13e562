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
