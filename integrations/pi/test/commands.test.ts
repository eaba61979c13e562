import assert from "node:assert/strict";
import { test } from "node:test";
import { castSessionName, IMMEDIATE_METHODS, MATERIA_USAGE, isNothingToActOn, materiaCompletions, MATERIA_SUBCOMMANDS, planIcarus, planMateria, resultText, runPlanned, runsWhileBusy } from "../src/commands.ts";

test("cast takes the rest as its request, single-spaced", () => {
	assert.deepEqual(planMateria("  cast   build  a\tthing "), { method: "cast.start", params: { request: "build a thing" } });
});

test("cast without a request is a usage error, no call", () => {
	const planned = planMateria("cast");
	assert.ok("usage" in planned && planned.usage.startsWith("/materia cast needs a request."));
});

test("each subcommand maps to its method", () => {
	const cases: Array<[string, string, Record<string, unknown>]> = [
		["continue", "cast.continue", {}],
		["abort", "cast.abort", {}],
		["status", "cast.status", {}],
		["casts", "cast.list", {}],
		["recast", "cast.recast", {}],
		["recast 2026-01-01T00-00-00-000Z", "cast.recast", { cast_id: "2026-01-01T00-00-00-000Z" }],
		["revive abc", "cast.revive", { cast_id: "abc" }],
		["grid", "grid.render", {}],
		["grid Full Auto", "grid.render", { loadout: "Full Auto" }],
		["loadout", "loadout.list", {}],
		["loadout Build", "loadout.set", { name: "Build" }],
	];
	for (const [args, method, params] of cases) assert.deepEqual(planMateria(args), { method, params }, args);
});

test("extra words and unknown subcommands are usage errors", () => {
	for (const args of ["abort now", "status x", "casts all", "recast a b", "", "frobnicate"]) {
		assert.ok("usage" in planMateria(args), args);
	}
	for (const sub of ["ui", "link"]) {
		// pi-materia's editor and linked casts: a pi-materia user's command is answered by name, not as a typo
		const planned = planMateria(`${sub} x`);
		assert.ok("usage" in planned && planned.usage.startsWith(`/materia ${sub} is pi-materia's and castor does not provide it`), sub);
	}
	const unknown = planMateria("frobnicate");
	assert.ok("usage" in unknown && unknown.usage.includes('Unknown /materia subcommand "frobnicate"'));
});

test("a usage error says what was wrong: the extra words, by subcommand", () => {
	const cases: Array<[string, string]> = [
		["abort now", '/materia abort takes no arguments (got "now").'],
		["status  x", '/materia status takes no arguments (got "x").'],
		["casts all", '/materia casts takes no arguments (got "all").'],
		["continue please", '/materia continue takes no arguments (got "please").'],
		["recast a b", '/materia recast takes at most one cast id (got "a b").'],
		["revive a b c", '/materia revive takes at most one cast id (got "a b c").'],
	];
	for (const [args, reason] of cases) {
		const planned = planMateria(args);
		assert.ok("usage" in planned && planned.usage.startsWith(reason), `${args}: ${"usage" in planned ? planned.usage : ""}`);
		assert.ok(planned.usage.includes("Usage: /materia cast <request>"), args);
	}
});

test("a usage error quotes the typed word on one short line, control characters escaped", () => {
	const long = planMateria("x".repeat(5000));
	assert.ok("usage" in long);
	assert.ok(long.usage.length < MATERIA_USAGE.length + 120, `${long.usage.length} characters`);
	assert.ok(long.usage.includes(`Unknown /materia subcommand "${"x".repeat(39)}…"`));
	const control = planMateria("\u001b[2J\u0007boom");
	assert.ok("usage" in control);
	assert.ok(!/[\u0000-\u001f\u007f-\u009f]/.test(control.usage), JSON.stringify(control.usage));
	assert.ok(control.usage.includes('Unknown /materia subcommand "\\u001b[2J\\u0007boom"'), JSON.stringify(control.usage));
	const extra = planMateria(`abort ${"y".repeat(300)}`);
	assert.ok("usage" in extra && extra.usage.includes(`(got "${"y".repeat(39)}…")`), "usage" in extra ? extra.usage : "");
	const unicode = planMateria("сast");
	assert.ok("usage" in unicode && unicode.usage.includes('Unknown /materia subcommand "сast"'));
});

test("abort and the read-only commands run while a turn is in flight; turn starters wait", () => {
	for (const args of ["abort", "status", "casts", "grid", "grid X", "loadout", "bogus", "cast"]) {
		assert.equal(runsWhileBusy(planMateria(args)), true, args);
	}
	for (const args of ["cast build it", "continue", "recast", "revive", "loadout Build"]) {
		assert.equal(runsWhileBusy(planMateria(args)), false, args);
	}
	assert.deepEqual([...IMMEDIATE_METHODS].sort(), ["cast.abort", "cast.list", "cast.status", "grid.render", "loadout.list"]);
});

test("icarus passes its words through", () => {
	assert.deepEqual(planIcarus("  context   hide "), { method: "icarus.command", params: { args: "context hide" } });
});

test("result text: text, else message, else JSON; level from the result", () => {
	assert.deepEqual(resultText("plain"), { text: "plain", level: "info" });
	assert.deepEqual(resultText({ text: "t", message: "m", level: "warning" }), { text: "t", level: "warning" });
	assert.deepEqual(resultText({ message: "m", level: "bogus" }), { text: "m", level: "info" });
	assert.deepEqual(resultText({ a: 1 }), { text: '{"a":1}', level: "info" });
	assert.deepEqual(resultText(null), { text: "null", level: "info" });
});

test("a command's reply is notified once and returned (pi-icarus-hook's /icarus handler returns it)", async () => {
	const shown: Array<[string, string]> = [];
	const show = (text: string, level: string) => shown.push([text, level]);
	const calls: Array<[string, Record<string, unknown>]> = [];
	const reply = await runPlanned(
		planIcarus(""),
		async (method, params) => {
			calls.push([method, params]);
			return { text: "Icarus hooks are off for this session.", level: "info" };
		},
		show,
		() => "unused",
	);
	assert.equal(reply, "Icarus hooks are off for this session.");
	assert.deepEqual(calls, [["icarus.command", { args: "" }]]);
	assert.deepEqual(shown, [["Icarus hooks are off for this session.", "info"]]);

	shown.length = 0;
	const warned = await runPlanned(planIcarus("on now"), async () => ({ text: "Unknown /icarus arguments", level: "warning" }), show, () => "");
	assert.equal(warned, "Unknown /icarus arguments");
	assert.deepEqual(shown, [["Unknown /icarus arguments", "warning"]]);

	shown.length = 0;
	const usage = planMateria("frobnicate");
	let called = false;
	const usageReply = await runPlanned(usage, async () => { called = true; }, show, () => "");
	assert.ok("usage" in usage && usageReply === usage.usage);
	assert.equal(called, false);
	assert.deepEqual(shown, [[usageReply, "warning"]]);

	shown.length = 0;
	const failed = await runPlanned(planIcarus("status"), async () => { throw new Error("castor is down"); }, show, (err) => `icarus: ${(err as Error).message}`);
	assert.equal(failed, "icarus: castor is down");
	assert.deepEqual(shown, [["icarus: castor is down", "error"]]);
});

test("a started cast names the session: materia: and the request's first 60 characters", () => {
	assert.equal(castSessionName("fix the parser"), "materia: fix the parser");
	assert.equal(castSessionName("x".repeat(100)), `materia: ${"x".repeat(60)}`);
});

test("a session name and a completion's description are cut between characters, never inside one", () => {
	const loneSurrogate = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;
	const name = castSessionName(`a${"😀".repeat(70)}`);
	assert.ok(!loneSurrogate.test(name), JSON.stringify(name));
	assert.equal(name, `materia: a${"😀".repeat(59)}`);
	const rows = [{ cast_id: "c1", status: "failed", resumable: true, request: `b${"😀".repeat(80)}` }];
	const description = materiaCompletions("recast ", rows)?.[0]?.description ?? "";
	assert.ok(!loneSurrogate.test(description), JSON.stringify(description));
	assert.equal(description, `b${"😀".repeat(70)}…`);
});

test("completions: subcommand names while the first word is typed", () => {
	assert.deepEqual(materiaCompletions("", null)?.map((i) => i.value), [...MATERIA_SUBCOMMANDS]);
	// "/materia  " (an extra space): Pi passes " ", still before the first word
	assert.deepEqual(materiaCompletions(" ", null)?.map((i) => i.value), [...MATERIA_SUBCOMMANDS]);
	assert.deepEqual(materiaCompletions("  \t", null)?.map((i) => i.value), [...MATERIA_SUBCOMMANDS]);
	assert.deepEqual(materiaCompletions("re", null)?.map((i) => i.value), ["recast", "revive"]);
	assert.deepEqual(materiaCompletions("c", null)?.map((i) => i.value), ["cast", "casts", "continue"]);
	assert.equal(materiaCompletions("zz", null), null);
	assert.equal(materiaCompletions("cast fix", null), null, "a request is free text");
});

test("completions: recast offers resumable casts, revive revivable ones, newest first, with status, socket and request", () => {
	const casts = [
		{ cast_id: "2026-05-12T10-00-00-000Z", status: "aborted", resumable: true, revivable: false, current_socket: "Socket-4", request: "a".repeat(100) },
		{ cast_id: "2026-05-11T10-00-00-000Z", status: "failed", resumable: true, revivable: true, current_socket: "Socket-2", request: "ship  it" },
		{ cast_id: "2026-05-10T10-00-00-000Z", status: "complete", resumable: false, revivable: false, request: "done" },
	];
	const recast = materiaCompletions("recast ", casts)!;
	assert.deepEqual(recast.map((i) => i.value), ["recast 2026-05-12T10-00-00-000Z", "recast 2026-05-11T10-00-00-000Z"]);
	assert.equal(recast[0]!.label, "2026-05-12T10-00-00-000Z  aborted  socket:Socket-4");
	assert.equal(recast[0]!.description, `${"a".repeat(71)}…`);
	assert.equal(recast[1]!.label, "2026-05-11T10-00-00-000Z  failed  socket:Socket-2");
	assert.equal(materiaCompletions("revive ", casts)![0]!.label, "2026-05-11T10-00-00-000Z  revivable  socket:Socket-2");
	assert.equal(recast[1]!.description, "ship it");
	assert.deepEqual(materiaCompletions("revive ", casts)!.map((i) => i.value), ["revive 2026-05-11T10-00-00-000Z"]);
	assert.deepEqual(materiaCompletions("recast 2026-05-11", casts)!.map((i) => i.value), ["recast 2026-05-11T10-00-00-000Z"]);
	assert.equal(materiaCompletions("recast ", null), null, "no castor running: no ids");
	assert.equal(materiaCompletions("revive 2026-05-12", casts), null);
	assert.equal(materiaCompletions("recast 2026-05-11T10-00-00-000Z ", casts), null, "one id only");
	const orphan = [{ cast_id: "2026-05-13T10-00-00-000Z", status: "orphaned", resumable: true, revivable: false, failed_reason: "lost\nits runtime" }];
	assert.deepEqual(materiaCompletions("recast", orphan)?.map((i) => i.value), ["recast"], "still the first word");
	assert.deepEqual(materiaCompletions("recast ", orphan)?.[0], { value: "recast 2026-05-13T10-00-00-000Z", label: "2026-05-13T10-00-00-000Z  failed  socket:-", description: "lost its runtime" });
});

test("nothing to act on (no cast to continue, abort, recast, revive or show) is pi-materia's info notice, not a failure", async () => {
	for (const command of ["continue", "abort", "recast", "revive", "status"]) assert.ok(isNothingToActOn(planMateria(command), "not_found"), command);
	assert.equal(isNothingToActOn(planMateria("recast 2026-05-12T10-00-00-000Z"), "not_found"), false, "a named cast castor does not know is an error");
	assert.equal(isNothingToActOn(planMateria("abort"), "conflict"), false);
	assert.equal(isNothingToActOn(planMateria("cast fix it"), "not_found"), false, "a start's not_found (a loadout) is a failure");
	assert.equal(isNothingToActOn(planMateria("casts"), "not_found"), false);
	const shown: Array<[string, string]> = [];
	const text = await runPlanned(
		planMateria("abort"),
		async () => { throw new Error("No active pi-materia cast to abort."); },
		(t, level) => shown.push([t, level]),
		(err) => ({ text: (err as Error).message, level: "info" }),
	);
	assert.equal(text, "No active pi-materia cast to abort.");
	assert.deepEqual(shown, [["No active pi-materia cast to abort.", "info"]]);
});

test("castor's refusal of a typed argument names it, what castor said, and what lists the valid ones", async () => {
	const { refusedArgumentText } = await import("../src/commands.ts");
	const data = { method: "grid.render", errors: [{ loc: "loadout", type: "string_too_long", msg: "String should have at most 200 characters" }], error_count: 1 };
	const grid = planMateria(`grid ${"g".repeat(3000)}`);
	assert.equal(refusedArgumentText(grid, data),
		"castor refused the loadout name (3000 characters): String should have at most 200 characters. /materia loadout lists the loadouts.");
	const revive = planMateria(`revive ${"r".repeat(2000)}`);
	assert.match(refusedArgumentText(revive, { errors: [{ loc: "cast_id", msg: "String should have at most 128 characters" }] }) ?? "",
		/^castor refused the cast id \(2000 characters\): String should have at most 128 characters\. \/materia casts lists the casts\.$/);
	// not a typed argument (castor's own session id or cwd), or no detail: the plain error stays
	assert.equal(refusedArgumentText(grid, { errors: [{ loc: "session_id", msg: "x" }] }), undefined);
	assert.equal(refusedArgumentText(grid, undefined), undefined);
	assert.equal(refusedArgumentText(planMateria("status"), data), undefined);
});
