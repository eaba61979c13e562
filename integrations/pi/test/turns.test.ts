import assert from "node:assert/strict";
import { test } from "node:test";
import { TurnTracker, type TurnHost } from "../src/turns.ts";

interface Sent {
	message: { customType: string; content: string; display: boolean; details?: unknown };
	options?: { triggerTurn?: boolean; deliverAs?: string };
}

function host(tools = ["read", "bash"]) {
	const sent: Sent[] = [];
	let active = [...tools];
	const pi: TurnHost & { sent: Sent[]; active(): string[] } = {
		sent,
		active: () => active,
		sendMessage: (message, options) => void sent.push({ message, options }),
		getActiveTools: () => [...active],
		setActiveTools: (names) => {
			active = [...names];
		},
		setModel: async () => true,
		setThinkingLevel: () => {},
	};
	return pi;
}

const idle = { isIdle: () => true };
const busy = { isIdle: () => false };
const assistant = (text: string, stopReason = "stop") => ({
	role: "assistant",
	content: [{ type: "text", text }],
	stopReason,
	usage: { input: 10, output: 5, cacheRead: 1, cacheWrite: 0, totalTokens: 16, cost: { total: 0.5 } },
});
const started = (pi: ReturnType<typeof host>, i = 0) => pi.sent.filter((s) => s.message.display === false)[i]?.message;

test("a dispatched turn is a hidden prompt that triggers a run; its end is reported once", async () => {
	const pi = host();
	const turns = new TurnTracker(pi);
	await turns.dispatch({ turn_id: "t1", prompt: "DO IT", summary: "sum" }, idle);
	assert.deepEqual(pi.sent[0], { message: { customType: "pi-materia", content: "sum", display: true }, options: { triggerTurn: false } });
	assert.deepEqual(pi.sent[1]?.options, { triggerTurn: true });
	assert.ok(turns.bindFromMessage(started(pi)));
	turns.onAgentEnd([assistant("DONE")]);
	const outcome = turns.settle("s", false, "e1");
	assert.deepEqual(outcome, {
		session_id: "s", turn_id: "t1", text: "DONE", stop_reason: "stop", error: null,
		usage: { input: 10, output: 5, cache_read: 1, cache_write: 0, total_tokens: 16, cost: 0.5 },
		usages: [{ input: 10, output: 5, cacheRead: 1, cacheWrite: 0, totalTokens: 16, cost: { total: 0.5 } }],
		aborted: false, entry_id: "e1",
	});
	assert.equal(turns.settle("s", false, null), undefined, "settles once");
});

test("a turn's two messages carry pi-materia's details; the prompt keeps castor's turn id", async () => {
	const pi = host();
	const turns = new TurnTracker(pi);
	const visible = { prefix: "materia", socketId: "Socket-2", materiaName: "Build", socketOrdinal: 2, eventType: "materia_prompt" };
	const hidden = { phase: "Socket-2", socketId: "Socket-2", materiaName: "Build", castor_turn_id: "spoofed" };
	await turns.dispatch({ turn_id: "t1", prompt: "P", summary: "S", summary_details: visible, prompt_details: hidden }, idle);
	assert.deepEqual(pi.sent[0]?.message, { customType: "pi-materia", content: "S", display: true, details: visible });
	assert.deepEqual(started(pi)?.details, { phase: "Socket-2", socketId: "Socket-2", materiaName: "Build", castor_turn_id: "t1" });
	assert.ok(turns.bindFromMessage(started(pi)));
	// details that are not a record are left out, never sent as they came
	const other = host();
	await new TurnTracker(other).dispatch({ turn_id: "t2", prompt: "P", summary: "S", summary_details: ["x"] as never, prompt_details: "y" as never }, idle);
	assert.deepEqual(other.sent[0]?.message, { customType: "pi-materia", content: "S", display: true });
	assert.deepEqual(other.sent[1]?.message.details, { castor_turn_id: "t2" });
});

test("a turn sent while Pi is busy is a follow-up", async () => {
	const pi = host();
	await new TurnTracker(pi).dispatch({ turn_id: "t1", prompt: "P" }, busy);
	assert.deepEqual(pi.sent[0]?.options, { triggerTurn: true, deliverAs: "followUp" });
});

test("Esc: the outcome says aborted, keeps the partial text and the usage", async () => {
	const pi = host();
	const turns = new TurnTracker(pi);
	await turns.dispatch({ turn_id: "t1", prompt: "P" }, idle);
	turns.bindFromMessage(started(pi));
	turns.onAgentEnd([assistant("half", "aborted")]);
	const outcome = turns.settle("s", true, null);
	assert.equal(outcome?.aborted, true);
	assert.equal(outcome?.stop_reason, "aborted");
	assert.equal(outcome?.text, "half");
	assert.equal(outcome?.usage?.input, 10);
});

test("a turn stopped at its start, before its first model request, used nothing: its zeros are its usage", async () => {
	const pi = host();
	const turns = new TurnTracker(pi);
	await turns.dispatch({ turn_id: "t1", prompt: "P" }, idle);
	turns.bindFromMessage(started(pi));
	turns.stoppedBeforeRequest();
	const zeros = { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, totalTokens: 0, cost: { total: 0 } };
	turns.onAgentEnd([{ ...assistant("", "aborted"), usage: zeros }]);
	const outcome = turns.settle("s", true, null);
	assert.equal(outcome?.aborted, true);
	assert.equal(outcome?.usage?.total_tokens, 0, "known to be nothing, not unknown (null)");
	assert.equal(outcome?.stopped_usage_unknown, undefined);
});

test("Esc before the provider reported usage: the stopped message's zeros are unknown, not nothing", async () => {
	const pi = host();
	const turns = new TurnTracker(pi);
	await turns.dispatch({ turn_id: "t1", prompt: "P" }, idle);
	turns.bindFromMessage(started(pi));
	const zeros = { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, totalTokens: 0, cost: { total: 0 } };
	turns.onAgentEnd([{ ...assistant("half", "aborted"), usage: zeros }]);
	const outcome = turns.settle("s", true, null);
	assert.equal(outcome?.text, "half");
	assert.equal(outcome?.usage, null, "castor records the turn as reporting no usage");
	assert.deepEqual(outcome?.usages, []);
	assert.equal(outcome?.stopped_usage_unknown, undefined, "usage null says it all");
	// Answers before the stop count as usual; only the stopped message's zeros are left out.
	await turns.dispatch({ turn_id: "t2", prompt: "P2" }, idle);
	turns.bindFromMessage(started(pi, 1));
	turns.onAgentEnd([assistant("", "toolUse"), { role: "toolResult", content: "ok" }, { ...assistant("", "aborted"), usage: zeros }]);
	const second = turns.settle("s", true, null);
	assert.equal(second?.usage?.input, 10);
	assert.equal(second?.usages.length, 1);
	assert.equal(second?.stopped_usage_unknown, true, "castor is told the stopped message's share is missing");
	// A stopped message that reported its usage (Anthropic's input tokens at the stream's start) leaves nothing out.
	await turns.dispatch({ turn_id: "t3", prompt: "P3" }, idle);
	turns.bindFromMessage(started(pi, 2));
	turns.onAgentEnd([assistant("", "toolUse"), { role: "toolResult", content: "ok" }, assistant("", "aborted")]);
	const third = turns.settle("s", true, null);
	assert.equal(third?.usages.length, 2);
	assert.equal(third?.stopped_usage_unknown, undefined);
});

test("a message the user typed after the turn answered (follow-up): the turn keeps its own answer", async () => {
	const pi = host();
	const turns = new TurnTracker(pi);
	await turns.dispatch({ turn_id: "t1", prompt: "P" }, idle);
	const prompt = started(pi);
	turns.bindFromMessage(prompt);
	turns.onAgentEnd([{ role: "custom", ...prompt }, assistant("BUILDER ANSWER"),
		{ role: "user", content: "what time is it" }, assistant("USER REPLY")]);
	turns.onAgentEnd([assistant("LATER USER REPLY")]);
	const outcome = turns.settle("s", false, null);
	assert.equal(outcome?.text, "BUILDER ANSWER");
	assert.equal(outcome?.aborted, false);
	assert.equal(outcome?.error, null);
	assert.equal(outcome?.usage?.input, 10, "the user's exchange is not the turn's usage");
});

test("a message the user typed before the turn answered (a steer between tool calls): the turn was taken over", async () => {
	const pi = host();
	const turns = new TurnTracker(pi);
	await turns.dispatch({ turn_id: "t1", prompt: "P" }, idle);
	turns.bindFromMessage(started(pi));
	turns.onAgentEnd([assistant("", "toolUse"), { role: "toolResult", content: "ok" },
		{ role: "user", content: "stop that, do X" }, assistant("DOING X")]);
	const outcome = turns.settle("s", false, null);
	assert.equal(outcome?.aborted, true, "reported as interrupted: castor keeps none of it");
	assert.notEqual(outcome?.text, "DOING X");
	assert.match(outcome?.error ?? "", /took it over/);
});

test("a user message Pi queued before the turn's prompt (kept through an RPC abort) is no take-over and goes in front of the prompt", async () => {
	const pi = host();
	const turns = new TurnTracker(pi);
	await turns.dispatch({ turn_id: "t1", prompt: "P" }, idle);
	turns.bindFromMessage(started(pi));
	const prompt = { role: "custom", customType: "castor-turn", content: "P", details: { castor_turn_id: "t1" }, timestamp: 2000 };
	const stale = { role: "user", content: "an old steer", timestamp: 1000 };
	assert.deepEqual(turns.leftoversFirst([{ role: "user", content: "hi", timestamp: 10 }, prompt, stale]),
		[{ role: "user", content: "hi", timestamp: 10 }, stale, prompt]);
	assert.equal(turns.leftoversFirst([prompt, { ...stale, timestamp: 3000 }]), undefined, "one typed during the turn stays where it is");
	turns.onAgentEnd([prompt, stale, assistant("BUILT")]);
	const outcome = turns.settle("s", false, null);
	assert.equal(outcome?.text, "BUILT");
	assert.equal(outcome?.aborted, false);
	assert.equal(outcome?.error, null);
});

test("castor aborts the running turn: found active once, its outcome says aborted, tools restored", async () => {
	const pi = host(["read", "bash"]);
	const turns = new TurnTracker(pi);
	await turns.dispatch({ turn_id: "t1", prompt: "P", tools: ["read"] }, idle);
	assert.deepEqual(pi.active(), ["read"]);
	turns.bindFromMessage(started(pi));
	assert.equal(turns.abort("t1"), "active");
	assert.equal(turns.abort("t1"), "unknown", "a second abort does not abort Pi's run again");
	turns.onAgentEnd([assistant("", "aborted")]);
	const outcome = turns.settle("s", true, null);
	assert.equal(outcome?.aborted, true);
	assert.deepEqual(pi.active(), ["read", "bash"]);
	assert.ok(turns.wasAborted("t1"));
});

test("abort while the turn is ending (already settled): unknown, but remembered", async () => {
	const pi = host();
	const turns = new TurnTracker(pi);
	await turns.dispatch({ turn_id: "t1", prompt: "P" }, idle);
	turns.bindFromMessage(started(pi));
	turns.onAgentEnd([assistant("ALL DONE")]);
	const outcome = turns.settle("s", false, null);
	assert.equal(outcome?.aborted, false);
	assert.equal(turns.abort("t1"), "unknown");
	assert.ok(turns.wasAborted("t1"), "its refused late end is then no error");
});

test("castor aborts a queued turn: it is dropped and its run, if Pi still starts it, is recognised", async () => {
	const pi = host(["read", "bash"]);
	const turns = new TurnTracker(pi);
	await turns.dispatch({ turn_id: "t1", prompt: "P", tools: [] }, busy);
	assert.deepEqual(pi.active(), []);
	assert.equal(turns.abort("t1"), "queued");
	assert.deepEqual(pi.active(), ["read", "bash"], "the queued turn's tool scope is undone");
	const message = started(pi);
	assert.ok(turns.isAbortedMessage(message));
	assert.equal(turns.bindFromMessage(message), false, "an aborted turn never binds a run");
	assert.equal(turns.settle("s", false, null), undefined, "so it reports nothing");
});

test("the runtime that asked for the turns went away: the running one is marked to stop, the waiting ones dropped, none reported", async () => {
	const pi = host(["read", "bash"]);
	const turns = new TurnTracker(pi);
	await turns.dispatch({ turn_id: "t1", prompt: "P", tools: ["read"] }, idle);
	turns.bindFromMessage(started(pi));
	await turns.dispatch({ turn_id: "t2", prompt: "Q", tools: [] }, busy);
	// A third turn whose settings are still being applied when the runtime goes.
	let release: (ok: boolean) => void = () => {};
	pi.setModel = () => new Promise<boolean>((resolve) => (release = resolve));
	const third = turns.dispatch({ turn_id: "t3", prompt: "R", model: { provider: "p", id: "m" } }, { ...idle, modelRegistry: { getAll: () => [{ provider: "p", id: "m" }] } } as never);
	assert.deepEqual(turns.orphan(), { active: "t1", dropped: ["t2", "t3"] });
	assert.deepEqual(pi.active(), ["read"], "the waiting turn's tool scope is undone; the running one's at its settle");
	release(true);
	await third;
	assert.equal(pi.sent.filter((s) => s.message.display === false).length, 2, "the turn being applied is never sent");
	assert.ok(turns.isAbortedMessage(started(pi, 1)), "a dropped turn's prompt Pi still delivers is stopped");
	turns.onAgentEnd([assistant("HALF", "aborted")]);
	const outcome = turns.settle("s", true, null);
	assert.equal(outcome?.aborted, true);
	assert.deepEqual(pi.active(), ["read", "bash"]);
	for (const id of ["t1", "t2", "t3"]) assert.ok(turns.wasOrphaned(id), id);
	assert.equal(turns.wasOrphaned("t4"), false);
	assert.deepEqual(turns.orphan(), { active: undefined, dropped: [] }, "nothing left to orphan");
});

test("a turn aborted before it was dispatched is never sent", async () => {
	const pi = host();
	const turns = new TurnTracker(pi);
	assert.equal(turns.abort("t9"), "unknown");
	await turns.dispatch({ turn_id: "t9", prompt: "P", summary: "S" }, idle);
	assert.equal(pi.sent.length, 0);
});

test("an abort for another turn leaves the running one alone", async () => {
	const pi = host();
	const turns = new TurnTracker(pi);
	await turns.dispatch({ turn_id: "t1", prompt: "P" }, idle);
	turns.bindFromMessage(started(pi));
	assert.equal(turns.abort("other"), "unknown");
	turns.onAgentEnd([assistant("OK")]);
	assert.equal(turns.settle("s", false, null)?.aborted, false);
	assert.equal(turns.isAbortedMessage(started(pi)), false);
});

test("aborted ids are remembered up to a bound", () => {
	const turns = new TurnTracker(host());
	for (let i = 0; i < 300; i++) turns.abort(`t${i}`);
	assert.equal(turns.wasAborted("t0"), false);
	assert.equal(turns.wasAborted("t299"), true);
});

test("a turn without an assistant answer is an error outcome", async () => {
	const pi = host();
	const turns = new TurnTracker(pi);
	await turns.dispatch({ turn_id: "t1", prompt: "P" }, idle);
	turns.bindFromMessage(started(pi));
	const outcome = turns.settle("s", false, null);
	assert.equal(outcome?.error, "Pi agent turn ended without an assistant response");
});

test("isolate: the context from the turn's hidden prompt on", async () => {
	const pi = host();
	const turns = new TurnTracker(pi);
	await turns.dispatch({ turn_id: "t1", prompt: "P", isolate: true }, idle);
	turns.bindFromMessage(started(pi));
	const messages = [{ role: "user", content: "old" }, { role: "custom", details: { castor_turn_id: "t1" } }, { role: "assistant" }];
	assert.deepEqual(turns.isolate(messages), messages.slice(1));
});

test("a follow-up turn delivered inside the user's run binds at its context and counts only its own answer", async () => {
	const pi = host();
	const turns = new TurnTracker(pi);
	await turns.dispatch({ turn_id: "t1", prompt: "P" }, busy);
	const prompt = { role: "custom", customType: "castor-turn", content: "P", details: { castor_turn_id: "t1" } };
	const userAnswer = assistant("USER ANSWER");
	assert.equal(turns.bindFromContext([{ role: "user", content: "hi" }, userAnswer]), undefined, "not yet in the context");
	assert.equal(turns.bindFromContext([{ role: "user", content: "hi" }, userAnswer, prompt]), "bound");
	assert.equal(turns.active?.turnId, "t1");
	turns.onAgentEnd([{ role: "user", content: "hi" }, userAnswer, prompt, assistant("TURN ANSWER")]);
	const outcome = turns.settle("s", false, null);
	assert.equal(outcome?.text, "TURN ANSWER");
	assert.equal(outcome?.usage?.input, 10, "the user's answer's usage is not the turn's");
});

test("an old castor prompt before the last answer never binds; an aborted follow-up says so", async () => {
	const pi = host();
	const turns = new TurnTracker(pi);
	const old = { role: "custom", details: { castor_turn_id: "t0" } };
	turns.abort("t0");
	assert.equal(turns.bindFromContext([old, assistant("A"), { role: "user", content: "next" }]), undefined);
	await turns.dispatch({ turn_id: "t2", prompt: "P" }, busy);
	turns.abort("t2");
	assert.equal(turns.bindFromContext([assistant("A"), { role: "custom", details: { castor_turn_id: "t2" } }]), "aborted");
	assert.equal(turns.active, undefined);
});

test("the user's run stopped at a withdrawn turn's prompt after their answer is not their abort", async () => {
	const pi = host();
	const turns = new TurnTracker(pi);
	await turns.dispatch({ turn_id: "t2", prompt: "P" }, busy);
	turns.abort("t2");
	const stale = { role: "custom", details: { castor_turn_id: "t2" } };
	const stopped = { role: "assistant", content: [], stopReason: "aborted" };
	const run = [{ role: "user", content: "hi" }, assistant("A"), stale];
	turns.bindOnAgentStart();
	assert.equal(turns.bindFromContext(run), "aborted");
	const heard = turns.userRunMessages([...run, stopped]);
	assert.deepEqual(heard, run.slice(0, 2), "cut before the withdrawn prompt");
	assert.equal(turns.userRunAborted(true), false, "the user's answer stands");
	// The next run that the user aborts is theirs: nothing of the cut is left over.
	turns.bindOnAgentStart();
	const own = [{ role: "user", content: "again" }, stopped];
	assert.deepEqual(turns.userRunMessages(own), own);
	assert.equal(turns.userRunAborted(true), true);
	// Cut before any final answer (the user's own answer was stopped too): still aborted.
	turns.bindOnAgentStart();
	assert.equal(turns.bindFromContext([{ role: "user", content: "x" }, stale]), "aborted");
	turns.userRunMessages([{ role: "user", content: "x" }, stale, stopped]);
	assert.equal(turns.userRunAborted(true), true);
});

test("a turn's outcome carries each answer's usage map as the provider wrote it, and the answering model", async () => {
	const pi = host();
	const turns = new TurnTracker(pi);
	await turns.dispatch({ turn_id: "t1", prompt: "P" }, idle);
	assert.ok(turns.bindFromMessage(started(pi)));
	// A provider (an extension's own) that reports usage in its own spellings: Pi's names are absent.
	const toolCall = { role: "assistant", content: [], stopReason: "toolUse", usage: { prompt_tokens: 7, completion_tokens: 2, cost: { input: 0.01, output: 0.02 } } };
	const answer = { ...assistant("DONE"), provider: "acme", model: "m-1", api: "openai-completions", thinkingLevel: "high",
		usage: { inputTokens: 3, outputTokens: 4, costUsd: 0.25, bad: Number.NaN } };
	turns.onAgentEnd([toolCall, answer]);
	const outcome = turns.settle("s", false, null);
	// A NaN goes by name (castor names it as an unreadable figure; it was null, and vanished unsaid).
	assert.deepEqual(outcome?.usages, [toolCall.usage, { inputTokens: 3, outputTokens: 4, costUsd: 0.25, bad: "NaN" }]);
	assert.deepEqual(outcome?.model, { provider: "acme", id: "m-1", api: "openai-completions" });
	assert.equal(outcome?.thinking_level, "high");
	assert.equal(outcome?.usage?.input, 0, "the summed legacy map knows only Pi's own names");
});

test("a materia model Pi cannot use falls back to the active model with a warning; the turn still runs", async () => {
	const cases: [string, { provider: string | null; id: string }, unknown, boolean, string][] = [
		["unknown", { provider: "acme", id: "nope" }, { find: () => undefined, getAll: () => [] }, true, "unknown_model"],
		["no credentials", { provider: "acme", id: "m" }, { find: () => ({ id: "m" }) }, false, "credentials_missing"],
		["ambiguous bare id", { provider: null, id: "m" }, { getAll: () => [{ id: "m", provider: "a" }, { id: "m", provider: "b" }] }, true, "ambiguous_model"],
		["no registry", { provider: "acme", id: "m" }, undefined, true, "model_registry_unavailable"],
	];
	for (const [name, model, registry, setOk, reason] of cases) {
		const pi = host();
		const set: unknown[] = [];
		pi.setModel = async (m) => (set.push(m), setOk);
		const warned: string[] = [];
		const turns = new TurnTracker(pi, (text) => warned.push(text));
		await turns.dispatch({ turn_id: "t1", prompt: "P", model }, { ...idle, modelRegistry: registry as never });
		assert.equal(started(pi)?.content, "P", `${name}: the turn is sent`);
		assert.equal(warned.length, 1, name);
		assert.match(warned[0] ?? "", new RegExp(`\\(${reason}\\); the turn runs on the active Pi model`), name);
	}
	const pi = host();
	const set: unknown[] = [];
	pi.setModel = async (m) => (set.push(m), true);
	const turns = new TurnTracker(pi, () => assert.fail("no warning"));
	await turns.dispatch({ turn_id: "t1", prompt: "P", model: { provider: null, id: "m" } }, { ...idle, modelRegistry: { getAll: () => [{ id: "m", provider: "a" }, { id: "x" }] } });
	assert.deepEqual(set, [{ id: "m", provider: "a" }], "a bare id one provider serves is that model");
});

test("a model fallback names the configured model, why, and the active Pi model it runs on (pi-materia's warning)", async () => {
	const active = { provider: "openai", id: "gpt-test" };
	for (const [registry, setOk, why] of [
		[{ find: () => undefined, getAll: () => [] }, true, 'configured model "acme/nope" is unavailable'],
		[{ find: () => ({ id: "nope" }) }, false, 'configured model "acme/nope" has no configured API key or credentials'],
	] as const) {
		const pi = host();
		pi.setModel = async () => setOk;
		const warned: string[] = [];
		const turns = new TurnTracker(pi, (text) => warned.push(text));
		await turns.dispatch({ turn_id: "t1", prompt: "P", model: { provider: "acme", id: "nope" } }, { ...idle, modelRegistry: registry as never, model: active });
		assert.equal(warned.length, 1);
		assert.ok(warned[0]!.includes(why), warned[0]);
		assert.ok(warned[0]!.includes("using the active Pi session model (openai/gpt-test)"), warned[0]);
	}
});

test("a thinking level Pi clamps for the model is said (pi-materia: using <level> instead); one it keeps is not", async () => {
	let level = "medium";
	const pi = host();
	pi.setThinkingLevel = ((wanted: string) => {
		level = wanted === "high" ? "off" : wanted; // a non-reasoning model: Pi runs it at off
	}) as never;
	pi.getThinkingLevel = () => level;
	const warned: string[] = [];
	const turns = new TurnTracker(pi, (text) => warned.push(text));
	await turns.dispatch({ turn_id: "t1", prompt: "P", thinking: "high" }, idle);
	assert.equal(warned.length, 1);
	assert.ok(warned[0]!.includes('configured thinking "high"') && warned[0]!.includes("using off instead"), warned[0]);
	const calm = new TurnTracker(pi, () => assert.fail("no warning"));
	await calm.dispatch({ turn_id: "t2", prompt: "P", thinking: "low" }, idle);
});

test("an abort with follow-up turns queued withdraws them as interrupted; a late delivery of one is cut off, the bound turn's answer stands", async () => {
	const pi = host();
	const turns = new TurnTracker(pi);
	await turns.dispatch({ turn_id: "t1", prompt: "P1", tools: ["read"] }, busy);
	assert.ok(turns.isQueuedFollowUp("t1"));
	assert.deepEqual(turns.withdrawFollowUps("s", null).length, 1);
	assert.equal(turns.isQueuedFollowUp("t1"), false);
	assert.deepEqual(turns.withdrawFollowUps("s", null), [], "withdrawn once");
	await turns.dispatch({ turn_id: "t2", prompt: "P2" }, idle);
	assert.deepEqual(turns.withdrawFollowUps("s", "e9"), [], "a turn started by its own run is not a follow-up");
	assert.ok(turns.bindFromMessage(started(pi, 1)));
	// Pi delivers t1's stale prompt after t2 answered: the run is stopped there; t2's answer stands.
	const stale = { role: "custom", details: { castor_turn_id: "t1" } };
	const own = { role: "custom", details: { castor_turn_id: "t2" } };
	assert.equal(turns.bindFromContext([own, assistant("T2 ANSWER")]), undefined);
	assert.equal(turns.bindFromContext([own, assistant("T2 ANSWER"), stale]), "aborted");
	turns.onAgentEnd([own, assistant("T2 ANSWER"), stale, { ...assistant(""), stopReason: "aborted" }]);
	const outcome = turns.settle("s", true, null);
	assert.equal(outcome?.turn_id, "t2");
	assert.equal(outcome?.text, "T2 ANSWER");
	assert.equal(outcome?.aborted, false);
});

test("a withdrawn follow-up turn's outcome is an interrupted one, and its tool scope is undone", async () => {
	const pi = host();
	const turns = new TurnTracker(pi);
	const before = pi.getActiveTools();
	await turns.dispatch({ turn_id: "t1", prompt: "P1", tools: ["read"] }, busy);
	const [outcome] = turns.withdrawFollowUps("s", "e1");
	assert.deepEqual(outcome, {
		session_id: "s", turn_id: "t1", text: "", stop_reason: "aborted",
		error: "the run this turn was queued behind was stopped before the turn started",
		usage: { input: 0, output: 0, cache_read: 0, cache_write: 0, total_tokens: 0, cost: null },
		usages: [], aborted: true, entry_id: "e1",
	});
	assert.deepEqual(pi.getActiveTools(), before);
	assert.ok(turns.wasAborted("t1"));
});

test("a follow-up turn sent again after a run castor stopped runs once: the copy Pi held is stopped, the answer stands", async () => {
	const pi = host();
	const turns = new TurnTracker(pi);
	await turns.dispatch({ turn_id: "t1", prompt: "P1" }, busy);
	assert.deepEqual(turns.redeliverFollowUps(), ["t1"]);
	const again = pi.sent.filter((s) => s.message.display === false);
	assert.equal(again.length, 2);
	assert.deepEqual(again[1], { message: again[0]!.message, options: { triggerTurn: true } }, "sent again, to start a run");
	assert.deepEqual(turns.withdrawFollowUps("s", null), [], "no longer waiting behind the stopped run");
	const prompt = { role: "custom", details: { castor_turn_id: "t1" } };
	assert.ok(turns.bindFromMessage(prompt));
	assert.equal(turns.bindFromContext([prompt]), undefined);
	assert.equal(turns.bindFromContext([prompt, assistant("DONE"), prompt]), "aborted", "the held copy is stopped");
	turns.onAgentEnd([prompt, assistant("DONE"), prompt, assistant("", "aborted")]);
	const outcome = turns.settle("s", true, null);
	assert.equal(outcome?.text, "DONE");
	assert.equal(outcome?.aborted, false);
	// A turn sent again whose run ended before Pi delivered the copy: the copy, delivered later, is stopped.
	await turns.dispatch({ turn_id: "t2", prompt: "P2" }, busy);
	turns.redeliverFollowUps();
	const prompt2 = { role: "custom", details: { castor_turn_id: "t2" } };
	assert.ok(turns.bindFromMessage(prompt2));
	turns.onAgentEnd([prompt2, assistant("half", "aborted")]);
	turns.settle("s", true, null);
	assert.equal(turns.bindFromContext([assistant("the user's answer"), prompt2]), "aborted");
});

test("a follow-up turn sent again can be sent later (Pi compacting): withdrawn meanwhile it is no longer waiting", async () => {
	const pi = host();
	const turns = new TurnTracker(pi);
	await turns.dispatch({ turn_id: "t1", prompt: "P1" }, busy);
	const later: Array<[string, (busy: boolean) => void]> = [];
	assert.deepEqual(turns.redeliverFollowUps((id, sendNow) => later.push([id, sendNow])), ["t1"]);
	assert.equal(pi.sent.filter((s) => s.message.display === false).length, 1, "not sent yet");
	assert.deepEqual(turns.withdrawFollowUps("s", null), [], "no longer waiting behind the stopped run");
	assert.ok(turns.isWaiting("t1"));
	later[0]![1](false);
	const again = pi.sent.filter((s) => s.message.display === false);
	assert.deepEqual(again[1], { message: again[0]!.message, options: { triggerTurn: true } }, "sent when the caller chose");
	assert.ok(turns.bindFromMessage({ role: "custom", details: { castor_turn_id: "t1" } }));
	assert.equal(turns.isWaiting("t1"), false, "started");
	// castor stops a turn held so: it no longer waits, and the caller does not send it.
	await turns.dispatch({ turn_id: "t2", prompt: "P2" }, busy);
	turns.redeliverFollowUps(() => undefined);
	turns.abort("t2");
	assert.equal(turns.isWaiting("t2"), false);
});

test("a turn sent again while a run of Pi's goes on queues behind it as a follow-up, never as a steer message", async () => {
	const pi = host();
	const turns = new TurnTracker(pi);
	await turns.dispatch({ turn_id: "t1", prompt: "P1" }, busy);
	const later: Array<(busy: boolean) => void> = [];
	turns.redeliverFollowUps((_id, sendNow) => later.push(sendNow));
	later[0]!(true); // the user's prompt Pi sent at its compaction's end streams
	const hidden = pi.sent.filter((s) => s.message.display === false);
	assert.deepEqual(hidden[1]!.options, { triggerTurn: true, deliverAs: "followUp" });
	assert.ok(turns.isQueuedFollowUp("t1"), "waits behind that run: an Esc of it withdraws the turn");
	// Pi delivers the copy it held first, at that run's end: the turn runs there; the copy sent again is stopped.
	const copy = { role: "custom", details: { castor_turn_id: "t1" } };
	assert.equal(turns.bindFromContext([{ role: "user" }, assistant("the user's answer"), copy]), "bound");
	assert.equal(turns.bindFromContext([{ role: "user" }, assistant("the user's answer"), copy, assistant("REVIEWED"), copy]), "aborted");
});

test("a run whose before_agent_start bound no castor turn is not a waiting turn's (Pi 1.x); without one it is (Pi 0.73)", async () => {
	const turns = new TurnTracker(host());
	await turns.dispatch({ turn_id: "t1", prompt: "P1" }, busy);
	turns.redeliverFollowUps(() => undefined); // held until Pi's compaction ends
	turns.bindOnAgentStart(true); // the user's prompt Pi sent at the compaction's end
	assert.equal(turns.active?.turnId, undefined, "the user's run was taken for the held turn");
	assert.ok(turns.isWaiting("t1"));
	turns.bindOnAgentStart(false); // Pi 0.73: a castor turn's run has no before_agent_start
	assert.equal(turns.active?.turnId, "t1");
});

test("a turn whose run was stopped before its request by the key meant for Pi's compaction waits again, and is sent again once", async () => {
	const pi = host();
	const turns = new TurnTracker(pi);
	await turns.dispatch({ turn_id: "t1", prompt: "P1" }, busy);
	const copy = { role: "custom", details: { castor_turn_id: "t1" } };
	assert.equal(turns.bindFromContext([{ role: "user" }, assistant("the user's answer"), copy]), "bound");
	assert.equal(turns.requeueUnrequested(), "t1");
	assert.equal(turns.active?.turnId, undefined);
	assert.equal(turns.settle("s", true, null), undefined, "no end reported for it");
	assert.deepEqual(turns.redeliverFollowUps(), ["t1"], "sent again as the run settles");
	assert.deepEqual(turns.withdrawFollowUps("s", null), []);
	// Pi holds no copy of it: its prompt sent again is bound and runs, never cut as a held copy.
	assert.ok(turns.bindFromMessage(copy));
	assert.equal(turns.bindFromContext([copy, assistant("", "aborted"), copy]), undefined);
});
