import assert from "node:assert/strict";
import { test } from "node:test";
import { compactionBegins, compactionSummary, entriesRemoved, type PiActivity } from "../src/compaction.ts";
import { addUsage, answerFields, emptyUsage, flattenText, promptText, summarizeMessage, toPiCustomMessage } from "../src/messages.ts";
import { listModels } from "../src/models.ts";
import { RpcError, unwrapParams } from "../src/rpc.ts";
import { opensOnStart, parseCommand, sessionIds } from "../src/runtime.ts";

test("flattenText: strings, text blocks, nested arrays; other blocks are dropped", () => {
	assert.equal(flattenText("a"), "a");
	assert.equal(flattenText([{ type: "text", text: "a" }, { type: "thinking", thinking: "x" }, "", [{ content: "b" }]]), "a\nb");
	assert.equal(flattenText(null), "");
	assert.equal(flattenText({ type: "image" }), "");
});

test("addUsage sums Pi usage into wire usage; unknown cost stays null", () => {
	const once = addUsage(emptyUsage(), { input: 1, output: 2, cacheRead: 3, cacheWrite: 4, totalTokens: 10 });
	assert.deepEqual(once, { input: 1, output: 2, cache_read: 3, cache_write: 4, total_tokens: 10, cost: null });
	const twice = addUsage(once, { input: 1, cost: { total: 0.25 } });
	assert.equal(twice.input, 2);
	assert.equal(twice.cost, 0.25);
	assert.deepEqual(addUsage(once, "junk"), once);
	assert.equal(addUsage(once, { input: Number.NaN }).input, 1);
});

test("addUsage: a boolean token count counts nothing, not even in the total Pi added it to", () => {
	// a provider's completion_tokens: true, as Pi leaves it: output true, totalTokens 10 + true = 11
	const sum = addUsage(emptyUsage(), { input: 10, output: true, cacheRead: 0, cacheWrite: 0, totalTokens: 11 });
	assert.equal(sum.output, 0);
	assert.equal(sum.total_tokens, 10);
	assert.equal(addUsage(emptyUsage(), { input: 10, output: true, totalTokens: 18 }).total_tokens, 17, "what a total adds beyond the parts stays");
	assert.equal(addUsage(emptyUsage(), { input: 10, output: false, totalTokens: 10 }).total_tokens, 10);
});

test("addUsage: a figure that is not a finite, non-negative number is not reported; the sum stays finite and capped", () => {
	const base = addUsage(emptyUsage(), { input: 10, output: 5, totalTokens: 15, cost: { total: 0.5 } });
	for (const bad of [Number.NaN, Number.POSITIVE_INFINITY, -1, "0.0012", "$0.0012", null, true, { total: 1 }]) {
		const sum = addUsage(base, { input: bad, output: bad, cacheRead: bad, cacheWrite: bad, totalTokens: bad, cost: { total: bad } });
		assert.deepEqual(sum, base, `figure ${String(bad)}`);
	}
	assert.deepEqual(addUsage(base, { input: 1, cost: 0.25 }), { ...base, input: 11 }, "a bare-number cost is castor's to read (usages)");
	assert.deepEqual(addUsage(base, { input: 1, cost: null }), { ...base, input: 11 });
	const huge = addUsage(addUsage(emptyUsage(), { input: 1e308, cost: { total: 1e308 } }), { input: 1e308, cost: { total: 1e308 } });
	assert.equal(huge.input, 1e18);
	assert.equal(huge.cost, 1e18);
	assert.ok(Number.isFinite(JSON.parse(JSON.stringify(huge)).input));
});

test("answerFields: a usage map goes as the provider wrote it, a NaN or Infinity in it by name (castor names it unreadable)", () => {
	const usage = { input: 10, output: "5", totalTokens: Number.NaN, cost: { total: Number.POSITIVE_INFINITY, output: Number.NEGATIVE_INFINITY, input: -1 } };
	assert.deepEqual(answerFields({ usage }).usage, { input: 10, output: "5", totalTokens: "NaN", cost: { total: "Infinity", output: "-Infinity", input: -1 } });
	assert.equal(answerFields({ usage: 3 }).usage, undefined);
	const loop: Record<string, unknown> = { input: 1 };
	loop.self = loop;
	assert.equal(answerFields({ usage: loop }).usage, null, "a map JSON cannot hold goes as null, never an exception");
});

test("summarizeMessage and toPiCustomMessage", () => {
	assert.deepEqual(summarizeMessage({ role: "assistant", content: "x", stopReason: "aborted" }), { role: "assistant", text: "x", stop_reason: "aborted", error: null });
	assert.deepEqual(toPiCustomMessage({ content: "hi", display: true, details: { a: 1 } }, "fb"), { customType: "fb", content: "hi", display: true, details: { a: 1 } });
	assert.equal(toPiCustomMessage({ content: "   " }, "fb"), undefined);
	assert.equal(toPiCustomMessage("x", "fb"), undefined);
});

test("parseCommand: JSON array or quoted words; empty and bad JSON are errors", () => {
	assert.deepEqual(parseCommand(`a "b c" 'd e' f`), ["a", "b c", "d e", "f"]);
	assert.deepEqual(parseCommand('["x", "y z"]'), ["x", "y z"]);
	assert.throws(() => parseCommand("   "), /empty/);
	assert.throws(() => parseCommand("[1]"), /non-empty array of strings/);
	assert.throws(() => parseCommand("[]"), /non-empty array of strings/);
});

test("unwrapParams and RpcError wire form", () => {
	assert.deepEqual(unwrapParams([{ a: 1 }]), { a: 1 });
	assert.deepEqual(unwrapParams({ a: 1 }), { a: 1 });
	assert.deepEqual(unwrapParams([1, 2]), {});
	assert.deepEqual(unwrapParams("x"), {});
	assert.deepEqual(new RpcError("not_found", "gone").toWire(), { code: "not_found", message: "gone" });
	assert.deepEqual(new RpcError("x", "m", { d: 1 }).toWire(), { code: "x", message: "m", data: { d: 1 } });
});

test("compaction counts: entries since the previous compaction; never the summary text", () => {
	const branch = [{ id: "a" }, { id: "c1", type: "compaction" }, { id: "b" }, { id: "c" }, { id: "keep" }];
	assert.equal(entriesRemoved(branch, "keep"), 2);
	assert.equal(entriesRemoved(branch, "missing"), null);
	const summary = compactionSummary({ summary: "SECRET".repeat(4), tokensBefore: 100, estimatedTokensAfter: 40, firstKeptEntryId: "keep" }, branch);
	assert.deepEqual(summary, { tokensBefore: 100, tokensAfter: 40, entriesRemoved: 2, summaryTokens: 6, firstKeptEntryId: "keep" });
	assert.ok(!JSON.stringify(summary).includes("SECRET"));
});

test("untilAborted: the user's Esc ends the wait for a slow castor tool call at once", async () => {
	const { untilAborted } = await import("../src/rpc.ts");
	const controller = new AbortController();
	let finish: (v: string) => void = () => {};
	const slow = new Promise<string>((resolve) => {
		finish = resolve;
	});
	const waiting = untilAborted(slow, controller.signal);
	controller.abort();
	await assert.rejects(waiting, /aborted/);
	finish("late");
	assert.equal(await untilAborted(Promise.resolve("ok"), new AbortController().signal), "ok");
	assert.equal(await untilAborted(Promise.resolve("no signal"), undefined), "no signal");
	const gone = new AbortController();
	gone.abort();
	await assert.rejects(untilAborted(Promise.resolve("x"), gone.signal), /aborted/);
});

test("isEscapeKey: a lone ESC and its keyboard-protocol forms; not an escape sequence, not a release", async () => {
	const { isEscapeKey } = await import("../src/interrupt.ts");
	for (const esc of ["\x1b", "\x1b[27u", "\x1b[27;1u", "\x1b[27;1:1u", "\x1b[27;1:2u", "\x1b[27;1;27~"]) assert.ok(isEscapeKey(esc), JSON.stringify(esc));
	for (const other of ["\x1b[A", "\x1bx", "\x1b\x1b", "\x1b[27;1:3u", "\x1b[27;5u", "\x1b[27;2;27~", "q", ""]) assert.ok(!isEscapeKey(other), JSON.stringify(other));
});

test("EscWatch: an Esc on the terminal aborts the signal, other keys do not, dispose unsubscribes; no UI, no signal", async () => {
	const { EscWatch } = await import("../src/interrupt.ts");
	const handlers = new Set<(data: string) => unknown>();
	const ctx = { hasUI: true, ui: { onTerminalInput: (h: (data: string) => unknown) => (handlers.add(h), () => handlers.delete(h)) } };
	const watch = new EscWatch(ctx);
	assert.ok(watch.signal && !watch.pressed);
	for (const h of handlers) assert.equal(h("\x1b[A"), undefined); // watched, never consumed
	assert.equal(watch.pressed, false);
	for (const h of handlers) h("\x1b");
	assert.equal(watch.pressed, true);
	watch.dispose();
	assert.equal(handlers.size, 0);
	assert.equal(new EscWatch({ hasUI: false, ui: ctx.ui }).signal, undefined); // print / RPC mode
	assert.equal(new EscWatch(undefined).signal, undefined);
	assert.equal(new EscWatch({ hasUI: true, ui: { onTerminalInput: () => { throw new Error("no terminal"); } } }).signal, undefined);
});

test("EscWatch: Pi's quit keys end the wait too -- a second Ctrl+C within 500 ms, Ctrl+D on an empty editor -- and say so", async () => {
	const { EscWatch, DOUBLE_CTRL_C_MS } = await import("../src/interrupt.ts");
	let clock = 1000;
	let editor = "";
	const handlers = new Set<(data: string) => unknown>();
	const ui = { onTerminalInput: (h: (data: string) => unknown) => (handlers.add(h), () => handlers.delete(h)), getEditorText: () => editor };
	const press = (data: string) => { for (const h of handlers) h(data); };
	const watch = new EscWatch({ hasUI: true, ui }, () => clock);
	press("\x03"); // one Ctrl+C clears the editor: not a quit
	clock += DOUBLE_CTRL_C_MS + 1;
	press("\x03"); // too late for a double press
	assert.equal(watch.pressed, false);
	clock += 100;
	press("\x1b[99;5u"); // the kitty form, within the window
	assert.ok(watch.pressed && watch.quitting);
	watch.dispose();
	editor = "half a prompt";
	const typing = new EscWatch({ hasUI: true, ui }, () => clock);
	press("\x04"); // Ctrl+D deletes a character when the editor has text
	assert.equal(typing.pressed, false);
	editor = "";
	press("\x04");
	assert.ok(typing.pressed && typing.quitting);
	typing.dispose();
	const esc = new EscWatch({ hasUI: true, ui }, () => clock);
	press("\x1b");
	assert.ok(esc.pressed && !esc.quitting);
	esc.dispose();
});

test("EscWatch: a submitted command that stops the run ends the wait; a picker's choice does, closing it does not", async () => {
	const { EscWatch, isEnterKey, submitEffect } = await import("../src/interrupt.ts");
	assert.ok(isEnterKey("\r") && isEnterKey("\x1b[13u") && isEnterKey("\x1b[13;1:2u"));
	assert.ok(!isEnterKey("\x1b[13;1:3u") && !isEnterKey("\x1b[13;2u") && !isEnterKey("r"));
	assert.equal(submitEffect(" /new "), "stop");
	assert.equal(submitEffect("/compact keep the API notes"), "stop");
	assert.equal(submitEffect("/clone"), "stop");
	assert.equal(submitEffect("/quit"), "quit");
	assert.equal(submitEffect("/resume"), "choose");
	assert.equal(submitEffect("/fork"), "choose");
	assert.equal(submitEffect("/model"), "picker");
	assert.equal(submitEffect("/settings"), "picker");
	for (const text of ["/newer", "/compaction", "tell me about /new", "/model sonnet", "", "/materia status"]) assert.equal(submitEffect(text), undefined, text);
	let editor = "";
	const handlers = new Set<(data: string) => unknown>();
	const ui = { onTerminalInput: (h: (data: string) => unknown) => (handlers.add(h), () => handlers.delete(h)), getEditorText: () => editor };
	const press = (data: string) => { for (const h of handlers) assert.equal(h(data), undefined); }; // never consumed
	const typed = (text: string) => { editor = text; press("\r"); editor = ""; };
	const prompt = new EscWatch({ hasUI: true, ui });
	typed("a follow-up prompt"); // Pi queues it behind the run
	assert.equal(prompt.pressed, false);
	typed("/new");
	assert.ok(prompt.pressed && prompt.cause === "abort" && !prompt.quitting);
	prompt.dispose();
	const quit = new EscWatch({ hasUI: true, ui });
	typed("/quit");
	assert.ok(quit.pressed && quit.quitting);
	quit.dispose();
	const picker = new EscWatch({ hasUI: true, ui });
	typed("/fork");
	assert.equal(picker.pressed, false, "the picker is open; nothing chosen yet");
	press("\x1b"); // closes the picker, not the run
	assert.equal(picker.pressed, false);
	typed("/resume");
	press("\x1b[B"); // moving in the picker
	press("\r"); // a session chosen: Pi replaces the session, aborting the run
	assert.ok(picker.pressed && picker.cause === "abort");
	picker.dispose();
	const settings = new EscWatch({ hasUI: true, ui });
	typed("/model");
	press("\r"); // a model chosen: the run goes on
	assert.equal(settings.pressed, false);
	typed("/settings");
	press("\x1b"); // the picker closed
	assert.equal(settings.pressed, false);
	press("\x1b"); // now the user's Esc
	assert.ok(settings.pressed && settings.cause === "esc");
	settings.dispose();
	const esc = new EscWatch({ hasUI: true, ui });
	press("\x1b"); // no picker open: the user's Esc
	assert.ok(esc.pressed && esc.cause === "esc");
	esc.dispose();
});

test("EscWatch.promptPending: a prompt submitted before the Esc (or RPC abort) that ended the wait; a command is no prompt", async () => {
	const { EventEmitter } = await import("node:events");
	const { EscWatch, isRpcPrompt } = await import("../src/interrupt.ts");
	let editor = "";
	const handlers = new Set<(data: string) => unknown>();
	const ui = { onTerminalInput: (h: (data: string) => unknown) => (handlers.add(h), () => handlers.delete(h)), getEditorText: () => editor };
	const press = (data: string) => { for (const h of handlers) h(data); };
	const typed = (text: string) => { editor = text; press("\r"); editor = ""; };
	const held = new EscWatch({ hasUI: true, ui });
	typed("fix the bug");
	press("\x1b");
	assert.ok(held.pressed && held.promptPending);
	held.dispose();
	const none = new EscWatch({ hasUI: true, ui });
	typed("/materia status"); // an extension's command, not a message for the model
	typed("   ");
	press("\x1b");
	assert.ok(none.pressed && !none.promptPending);
	none.dispose();
	const after = new EscWatch({ hasUI: true, ui });
	press("\x1b");
	typed("typed after the Esc");
	assert.ok(after.pressed && !after.promptPending, "only a prompt before what ended the wait counts");
	after.dispose();
	for (const type of ["prompt", "steer", "follow_up"]) assert.ok(isRpcPrompt(JSON.stringify({ type, message: "m" })), type);
	assert.ok(!isRpcPrompt('{"type":"abort"}') && !isRpcPrompt('{"type":"pro') && !isRpcPrompt("prompt"));
	const proc = Object.assign(new EventEmitter(), { stdin: Object.assign(new EventEmitter(), { readableFlowing: true as boolean | null, readableEnded: false }) });
	const rpc = new EscWatch({ hasUI: true, mode: "rpc", ui: { onTerminalInput: () => () => {} } }, Date.now, proc);
	proc.stdin.emit("data", Buffer.from('{"type":"prompt","message":"x","id":"1"}\n{"type":"abort","id":"2"}\n'));
	assert.ok(rpc.pressed && rpc.cause === "abort" && rpc.promptPending, "the prompt line came first, in the same chunk");
	rpc.dispose();
});

test("EscWatch with the process: Pi's quit signals (only those Pi handles), and in RPC mode its input's end and an abort command", async () => {
	const { EventEmitter } = await import("node:events");
	const { EscWatch, isRpcAbort } = await import("../src/interrupt.ts");
	const proc = Object.assign(new EventEmitter(), { stdin: Object.assign(new EventEmitter(), { readableFlowing: true as boolean | null, readableEnded: false }) });
	// No handler of Pi's for a signal: not listened to (ours would keep the process alive).
	assert.equal(new EscWatch(undefined, Date.now, proc).signal, undefined);
	proc.on("SIGTERM", () => {});
	const term = new EscWatch(undefined, Date.now, proc);
	assert.ok(term.signal && !term.pressed);
	assert.equal(proc.listenerCount("SIGHUP"), 0);
	proc.emit("SIGTERM");
	assert.ok(term.pressed && term.quitting && term.cause === "quit");
	term.dispose();
	assert.equal(proc.listenerCount("SIGTERM"), 1); // Pi's own, left alone
	// RPC mode: an abort command (even split over chunks) ends the wait as an abort, not a quit.
	const rpc = { hasUI: true, mode: "rpc", ui: { onTerminalInput: () => () => {} } };
	const abort = new EscWatch(rpc, Date.now, proc);
	proc.stdin.emit("data", Buffer.from('{"type":"get_state","id":"1"}\n{"type":"abo'));
	assert.equal(abort.pressed, false);
	proc.stdin.emit("data", Buffer.from('rt","id":"2"}\n'));
	assert.ok(abort.pressed && !abort.quitting && abort.cause === "abort");
	abort.dispose();
	assert.equal(proc.stdin.listenerCount("data"), 0);
	assert.equal(proc.stdin.listenerCount("end"), 0);
	const eof = new EscWatch(rpc, Date.now, proc);
	proc.stdin.emit("end");
	assert.ok(eof.quitting);
	eof.dispose();
	// A paused input is not resumed (no data listener), its end is still watched; outside RPC mode, neither.
	proc.stdin.readableFlowing = false;
	const paused = new EscWatch(rpc, Date.now, proc);
	assert.equal(proc.stdin.listenerCount("data"), 0);
	paused.dispose();
	new EscWatch({ ...rpc, mode: "tui" }, Date.now, proc).dispose();
	assert.equal(proc.stdin.listenerCount("end"), 0);
	for (const line of ['{"type":"abort"}', '{"id":"x","type":"abort"}', '{"type":"new_session"}', '{"type":"fork","entryId":"e"}', '{"type":"compact"}']) assert.ok(isRpcAbort(line), line);
	for (const line of ['{"type":"abort_bash"}', '{"type":"prompt","message":"abort"}', '{"type":"get_state"}', '"abort"', "rt\"}", ""]) assert.ok(!isRpcAbort(line), line);
});

test("holdWhileQuitting: held while Pi shuts down, also past castor's start; not held once castor's start settles without a shutdown; never past its bound", async () => {
	const { holdWhileQuitting } = await import("../src/interrupt.ts");
	const later = (ms: number) => new Promise<"later">((resolve) => setTimeout(() => resolve("later"), ms));
	const held = (hold: Promise<void>, ms: number) => Promise.race([hold.then(() => "returned" as const), later(ms)]);
	// Pi shut down (castor killed, so its start failed): the handler does not return, Pi exits first.
	assert.equal(await held(holdWhileQuitting(Promise.reject(new Error("runtime_exited")), () => true, 10_000), 100), "later");
	assert.equal(await held(holdWhileQuitting(Promise.resolve(), () => true, 10_000), 100), "later");
	// Not Pi's quit after all (Pi times the two Ctrl+C itself): back as castor's start settles.
	let up!: () => void;
	const start = new Promise<void>((resolve) => (up = resolve));
	const notQuitting = holdWhileQuitting(start, () => false, 10_000);
	assert.equal(await held(notQuitting, 50), "later");
	up();
	assert.equal(await held(notQuitting, 100), "returned");
	// Whatever happens, returned after the bound.
	assert.equal(await held(holdWhileQuitting(new Promise(() => {}), () => true, 20), 1000), "returned");
});

test("StopKeyWatch: every Esc on the terminal and every RPC abort line, never consumed; a paused input is listened to only once Pi resumes it", async () => {
	const { EventEmitter } = await import("node:events");
	const { StopKeyWatch } = await import("../src/interrupt.ts");
	let handler: ((data: string) => unknown) | undefined;
	let unsubscribed = false;
	const ui = { onTerminalInput: (h: (data: string) => unknown) => ((handler = h), () => { unsubscribed = true; }) };
	const seen: string[] = [];
	const tui = new StopKeyWatch({ hasUI: true, mode: "tui", ui }, (cause) => seen.push(cause));
	assert.equal(handler?.("\x1b"), undefined); // never consumed
	handler?.("x");
	handler?.("\x1b[A"); // an arrow key is no Esc
	handler?.("\x1b");
	assert.deepEqual(seen, ["esc", "esc"], "every Esc, not only the first");
	tui.dispose();
	assert.ok(unsubscribed);
	const stdin = Object.assign(new EventEmitter(), { readableFlowing: null as boolean | null, readableEnded: false });
	const proc = Object.assign(new EventEmitter(), { stdin });
	const rpcSeen: string[] = [];
	const rpc = new StopKeyWatch({ hasUI: true, mode: "rpc", ui: { onTerminalInput: () => () => {} } }, (cause) => rpcSeen.push(cause), proc);
	assert.equal(stdin.listenerCount("data"), 0, "a data listener would start Pi's paused input");
	stdin.readableFlowing = true;
	stdin.emit("resume");
	assert.equal(stdin.listenerCount("data"), 1);
	stdin.emit("data", Buffer.from('{"type":"abort","id":"1"}\n{"type":"get_state"}\n{"type":"abo'));
	stdin.emit("data", Buffer.from('rt"}\n'));
	assert.deepEqual(rpcSeen, ["abort", "abort"]);
	const thrower = new StopKeyWatch({ hasUI: true, mode: "tui", ui }, () => { throw new Error("the caller's fault"); });
	assert.doesNotThrow(() => handler?.("\x1b"));
	thrower.dispose();
	rpc.dispose();
	assert.equal(stdin.listenerCount("data"), 0);
	assert.equal(stdin.listenerCount("resume"), 0);
});

test("StopKeyWatch: an Esc some other component takes (isStop false) is no stop; unknown (undefined) or a throwing isStop counts it", async () => {
	const { StopKeyWatch } = await import("../src/interrupt.ts");
	let handler: ((data: string) => unknown) | undefined;
	const ui = { onTerminalInput: (h: (data: string) => unknown) => ((handler = h), () => {}) };
	const seen: string[] = [];
	let verdict: boolean | undefined = false;
	const watch = new StopKeyWatch({ hasUI: true, mode: "tui", ui }, (cause) => seen.push(cause), undefined, () => {
		if (verdict === null as unknown) throw new Error("a stale TUI");
		return verdict;
	});
	assert.equal(handler?.("\x1b"), undefined);
	assert.deepEqual(seen, [], "a picker's Esc");
	verdict = true;
	handler?.("\x1b");
	verdict = undefined;
	handler?.("\x1b");
	verdict = null as unknown as undefined;
	handler?.("\x1b");
	assert.deepEqual(seen, ["esc", "esc", "esc"]);
	watch.dispose();
});

test("EscWatch: an Esc some other component takes (isStop false) does not end the wait; one that is the user's stop does", async () => {
	const { EscWatch } = await import("../src/interrupt.ts");
	let handler: ((data: string) => unknown) | undefined;
	const ui = { onTerminalInput: (h: (data: string) => unknown) => ((handler = h), () => {}), getEditorText: () => "" };
	let verdict: boolean | undefined = false;
	const watch = new EscWatch({ hasUI: true, mode: "tui", ui }, Date.now, undefined, () => verdict);
	handler?.("\x1b");
	assert.equal(watch.pressed, false, "the model selector's Esc (opened by its key, no command typed)");
	verdict = true;
	handler?.("\x1b");
	assert.equal(watch.cause, "esc");
	watch.dispose();
});

test("escIsAStop: Pi's editor (app actions) with its completion list shut is a stop; a picker, a dialog, the completion list, an idle bash mode are not; no view is unknown", async () => {
	const { escIsAStop } = await import("../src/interrupt.ts");
	const editor = (text = "", completing = false) => ({ onAction: () => {}, getText: () => text, isShowingAutocomplete: () => completing });
	const view = (focused: unknown) => ({ getFocusedComponent: () => focused });
	const idle = () => false;
	const busy = () => true;
	assert.equal(escIsAStop(view(editor()), idle), true);
	assert.equal(escIsAStop(view(editor("half a prompt")), idle), true);
	assert.equal(escIsAStop(view(editor("", true)), idle), false, "the completion list takes it");
	assert.equal(escIsAStop(view(editor("!ls")), idle), false, "an idle bash mode clears the editor");
	assert.equal(escIsAStop(view(editor("!ls")), busy), true, "a run going on is stopped in bash mode too");
	assert.equal(escIsAStop(view({ handleInput: () => {}, getText: () => "" }), idle), false, "a picker, a dialog (no app actions)");
	assert.equal(escIsAStop(view(null), idle), undefined, "a TUI Pi swapped out: nothing has its focus");
	assert.equal(escIsAStop(undefined, idle), undefined);
	assert.equal(escIsAStop({}, idle), undefined);
	assert.equal(escIsAStop({ getFocusedComponent: () => { throw new Error("stale"); } }, idle), undefined);
	assert.equal(escIsAStop(view({ onAction: () => {}, isShowingAutocomplete: () => { throw new Error("odd"); } }), idle), true);
});

test("StderrRoute: written through outside the terminal UI, only kept under it; the tail is bounded", async () => {
	const { StderrRoute, TAIL_BYTES } = await import("../src/stderr.ts");
	let mode: string | undefined = "rpc";
	const written: string[] = [];
	const route = new StderrRoute(() => mode, (text) => written.push(text));
	route.push("castor serve: listening on stdio\n");
	assert.deepEqual(written, ["castor serve: listening on stdio\n"]);
	mode = "tui";
	route.push("a warning\n\nhalf a li");
	route.push("ne\n");
	assert.equal(written.length, 1); // nothing drawn over Pi's screen
	assert.deepEqual(route.lastLines(2), ["a warning", "half a line"]);
	mode = undefined; // a Pi without ctx.mode: stderr as before
	route.push("x\n");
	assert.equal(written.at(-1), "x\n");
	route.push("y".repeat(TAIL_BYTES * 2));
	assert.deepEqual(route.lastLines(5), ["y".repeat(TAIL_BYTES)]);
});

test("isStartLine: the stdio start line, plain or as a JSON log line's message; nothing else", async () => {
	const { isStartLine } = await import("../src/stderr.ts");
	assert.equal(isStartLine("castor serve: listening on stdio; token file: -; console: -"), true);
	const json = JSON.stringify({ text: "castor serve: listening on stdio; token file: -; console: -\n",
		record: { message: "castor serve: listening on stdio; token file: -; console: -", extra: { actor: "/endpoint" } } });
	assert.equal(isStartLine(json), true);
	assert.equal(isStartLine(JSON.stringify({ record: { message: "castor: a warning" } })), false);
	assert.equal(isStartLine("{not json"), false);
	assert.equal(isStartLine("a warning: castor serve: listening on stdio"), false);
});

test("cutText keeps UTF-8 characters whole and says how long the text was", async () => {
	const { cutText } = await import("../src/messages.ts");
	assert.deepEqual(cutText("short", 16), { text: "short" });
	const text = "aé€😀".repeat(10); // 1, 2, 3 and 4 bytes
	const cut = cutText(text, 12);
	assert.equal(cut.cutFrom, Buffer.byteLength(text));
	assert.ok(Buffer.byteLength(cut.text) <= 12 && text.startsWith(cut.text));
	assert.equal(cut.text, "aé€😀a"); // 1 + 2 + 3 + 4 + 1 = 11 bytes; the next é would be 13
});

test("oversize names a string or a message over what castor reads; under it, nothing", async () => {
	const { oversize, MAX_WIRE_STRING_BYTES } = await import("../src/rpc.ts");
	assert.equal(oversize({ a: ["x".repeat(1000)], b: 1 }), undefined);
	assert.match(oversize({ messages: [{ text: "é".repeat(MAX_WIRE_STRING_BYTES / 2 + 1) }] }) ?? "", /8 MiB/);
	const parts = Array.from({ length: 3 }, () => "x".repeat(MAX_WIRE_STRING_BYTES - 1));
	assert.match(oversize({ parts }) ?? "", /16 MiB/);
});

test("promptText: a string prompt as is, content blocks flattened, none as null", () => {
	assert.equal(promptText("  hello "), "  hello ");
	assert.equal(promptText([{ type: "text", text: "look at" }, { type: "image", data: "AAAA", mimeType: "image/png" }, { type: "text", text: "this" }]), "look at\nthis");
	assert.equal(promptText({ content: "from an object" }), "from an object");
	assert.equal(promptText(undefined), null);
	assert.equal(promptText(null), null);
	assert.equal(promptText(42), "");
});

test("opensOnStart: a new, replaced, unknown or shut-down session is opened again; the same one started twice is not", () => {
	assert.equal(opensOnStart("", "s1", false), true); // the first start
	assert.equal(opensOnStart("s1", "s2", false), true); // a replaced session
	assert.equal(opensOnStart("s1", "s1", true), true); // shut down since (session.close ran)
	assert.equal(opensOnStart("", "", false), true); // no known id: nothing to recognise
	assert.equal(opensOnStart("s1", "s1", false), false); // a repeated start: open already, castor dedupes it
});

test("listModels: Pi's registry as castor reads it; no registry is `unsupported`, not an empty list", () => {
	const local = { provider: "ollama", id: "qwen3:4b", baseUrl: "http://127.0.0.1:11434/v1", contextWindow: 32768 };
	const remote = { provider: "openai", id: "gpt-x", name: "GPT X", api: "openai-responses", reasoning: true };
	const listed = listModels({ getAll: () => [local, remote], getAvailable: () => [remote] }, remote);
	assert.deepEqual(listed, {
		models: [
			{ provider: "ollama", id: "qwen3:4b", name: "qwen3:4b", api: null, base_url: "http://127.0.0.1:11434/v1", available: false, context_window: 32768, reasoning: false },
			{ provider: "openai", id: "gpt-x", name: "GPT X", api: "openai-responses", base_url: null, available: true, context_window: null, reasoning: true },
		],
		current: { provider: "openai", id: "gpt-x" },
	});
	assert.equal(listModels({ getAll: () => [local] }, undefined).models[0].available, true); // no getAvailable: all usable
	for (const registry of [undefined, null, {}, { find: () => undefined }]) {
		assert.throws(() => listModels(registry, undefined), (err: unknown) => err instanceof RpcError && err.code === "unsupported");
	}
});

test("sessionIds: Pi's id as both; a session without one gets an id of its own, kept until a shutdown", () => {
	let made = 0;
	const newId = () => `pi-anon-${++made}`;
	const none = { castorId: "", harnessId: "" };
	assert.deepEqual(sessionIds("s1", none, false, newId), { castorId: "s1", harnessId: "s1" });
	const anon = sessionIds("", none, false, newId);
	assert.deepEqual(anon, { castorId: "pi-anon-1", harnessId: "" });
	assert.deepEqual(sessionIds("", anon, false, newId), anon); // started again: the same session
	assert.equal(opensOnStart(anon.castorId, sessionIds("", anon, false, newId).castorId, false), false);
	assert.deepEqual(sessionIds("", anon, true, newId), { castorId: "pi-anon-2", harnessId: "" }); // after a shutdown
	assert.deepEqual(sessionIds("", { castorId: "s1", harnessId: "s1" }, false, newId), { castorId: "pi-anon-3", harnessId: "" });
	assert.deepEqual(sessionIds("s2", anon, false, newId), { castorId: "s2", harnessId: "s2" });
});

test("boundedBehind: a call behind one nobody waits for waits for it at most the bound", async () => {
	const { boundedBehind, StillBehind } = await import("../src/interrupt.ts");
	const never = new Promise<void>(() => {});
	const late = new Promise<string>((r) => setTimeout(() => r("late"), 200));
	await assert.rejects(boundedBehind(late, never, 20), (err: unknown) => err instanceof StillBehind);
	// the one ahead answers within the bound: the call is waited for in full, past the bound
	const ahead = new Promise<void>((r) => setTimeout(r, 5));
	assert.equal(await boundedBehind(new Promise<string>((r) => setTimeout(() => r("full"), 100)), ahead, 30), "full");
	// nothing ahead, or the call answering first: the call itself
	assert.equal(await boundedBehind(Promise.resolve("now"), undefined, 1), "now");
	assert.equal(await boundedBehind(Promise.resolve("first"), never, 1000), "first");
	await assert.rejects(boundedBehind(Promise.reject(new Error("boom")), never, 1000), /boom/);
});

/**
 * The wait for the compaction a run Pi stopped itself makes way for (the user's /compact aborts the
 * run, waits for Pi's idle, then compacts). Pi's order -- its settle handlers, its idle wait, the
 * compaction's start -- cannot be moved with the real Pi, so both orders are driven here on a fake clock.
 */
function fakeClock() {
	let t = 0;
	const slept: number[] = [];
	return {
		now: () => t,
		sleep: async (ms: number) => {
			slept.push(ms);
			t += ms;
		},
		slept,
	};
}

test("compactionBegins: a compaction visible right after Pi's settle (Pi's order today)", async () => {
	const clock = fakeClock();
	const states: PiActivity[] = ["compacting"];
	assert.equal(await compactionBegins(() => states.shift() ?? "idle", 1000, clock.sleep, clock.now), "compacting");
	assert.deepEqual(clock.slept, [0], "read after a macrotask, once");
});

test("compactionBegins: a compaction that begins some polls later is still waited for (one read after a tick missed it)", async () => {
	const clock = fakeClock();
	const states: PiActivity[] = ["idle", "idle", "idle", "compacting"];
	assert.equal(await compactionBegins(() => states.shift() ?? "idle", 1000, clock.sleep, clock.now), "compacting");
	assert.ok(clock.now() < 1000);
});

test("compactionBegins: a run of Pi's own, or the session going, ends the wait; none within the bound is a timeout", async () => {
	const clock = fakeClock();
	assert.equal(await compactionBegins(() => "run", 1000, clock.sleep, clock.now), "run");
	assert.equal(await compactionBegins(() => "gone", 1000, clock.sleep, clock.now), "gone");
	const idle = fakeClock();
	assert.equal(await compactionBegins(() => "idle", 1000, idle.sleep, idle.now), "timeout");
	assert.ok(idle.now() >= 1000 && idle.now() < 1100, "bounded");
	const once = fakeClock();
	assert.equal(await compactionBegins(() => "idle", 0, once.sleep, once.now), "timeout", "a bound of 0 reads once");
	assert.deepEqual(once.slept, [0]);
});
