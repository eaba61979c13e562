// pi-icarus-hook's own test scenarios, run against castor through castor's Pi extension.
//
// The host is a fake Pi (the handlers, commands and tools the extension registers, a ctx with
// ui/sessionManager/trust): it calls the handlers the way pi-icarus-hook's tests call its own,
// and reads what they return -- the one place a real Pi shows nothing (a command handler's
// return value, a before_agent_start result before Pi uses it). castor is real (`castor serve
// --stdio`) over the reference Icarus backend, whose call log proves what ran.
//
// argv: <the built extension's index.js>. env: as tests/e2e/test_pi_fake_host.py sets it.
// Prints "FAKE PI HOST OK" at the end; any failed check exits non-zero with its message.
import assert from "node:assert/strict";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

const { default: extension } = await import(process.argv[2]);
const project = process.env.FAKE_PI_PROJECT;
const agentDir = process.env.PI_CODING_AGENT_DIR;
const callLog = process.env.ICARUS_REF_CALL_LOG;
mkdirSync(join(project, ".pi"), { recursive: true });
writeFileSync(join(project, ".pi", "settings.json"), JSON.stringify({ piIcarusHook: { contextDisplay: false, classifier: "none", adminTools: false } }));
writeFileSync(join(agentDir, "settings.json"), JSON.stringify({ piIcarusHook: { hiddenDisplay: false, unrelated: "preserved" } }));

const calls = (name) => existsSync(callLog)
	? readFileSync(callLog, "utf8").trim().split("\n").filter(Boolean).map((l) => JSON.parse(l)).filter((r) => r.phase === "start" && r.call === name)
	: [];
const until = async (what, check) => {
	const deadline = Date.now() + 10_000;
	while (!check()) {
		if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
		await new Promise((r) => setTimeout(r, 20));
	}
};

function host() {
	const h = { handlers: {}, commands: {}, tools: new Map(), messages: [], statuses: {}, notes: [] };
	h.pi = {
		registerFlag() {},
		getFlag() { return undefined; },
		on(event, handler) { h.handlers[event] = handler; },
		registerCommand(name, command) { h.commands[name] = command.handler; },
		registerTool(tool) { h.tools.set(tool.name, tool); },
		sendMessage(message, options) { h.messages.push({ message, options }); },
		appendEntry() {},
	};
	h.ctx = (id) => ({
		// print mode: its session_start returns once castor is up, as these scenarios read it (in RPC
		// mode castor starts behind Pi's session start, which must not hold Pi's input).
		cwd: project, mode: "print",
		ui: { setStatus(key, text) { h.statuses[key] = text; }, notify(message, level) { h.notes.push([message, level]); } },
		sessionManager: { getSessionId: () => id, getSessionFile: () => null, getLeafId: () => null },
		isProjectTrusted: () => true, isIdle: () => true, hasPendingMessages: () => false,
	});
	extension(h.pi);
	return h;
}

const h = host();
const sid = "manager-session-id";
const ctx = h.ctx(sid);

// session_start: startup context through sendMessage, nothing returned, on_session_start's kwargs.
assert.equal(await h.handlers.session_start({ type: "session_start", reason: "startup" }, ctx), undefined);
// Sent before the handler resolves (castor writes message.send ahead of the event's answer).
assert.deepEqual(h.messages, [{ message: { customType: "icarus-session-context", content: "startup memory", display: false }, options: { triggerTurn: false } }]);
assert.deepEqual(calls("hooks.on_session_start").map((c) => c.kwargs), [{ session_id: sid, platform: "pi" }]);
assert.equal(h.statuses.icarus, "🪽 Icarus");

// The same known session started again: deduplicated, and no error.
await h.handlers.session_start({ type: "session_start", reason: "startup" }, ctx);
assert.equal(calls("hooks.on_session_start").length, 1);
assert.deepEqual(h.notes.filter(([, level]) => level === "error"), []);

// /icarus replies are the handlers' return values; the footer follows.
assert.match(String(await h.commands.icarus("", ctx)), /hooks are off/);
assert.equal(h.statuses.icarus, undefined);
assert.equal(await h.handlers.before_agent_start({ type: "before_agent_start", prompt: "disabled prompt" }, ctx), undefined);
assert.match(String(await h.commands.icarus("", ctx)), /hooks are on/);
assert.equal(h.statuses.icarus, "🪽 Icarus");

// First-turn rules: disabled, empty and blank prompts do not consume it.
await h.handlers.before_agent_start({ type: "before_agent_start", prompt: "" }, ctx);
await h.handlers.before_agent_start({ type: "before_agent_start", prompt: "  \n  " }, ctx);
assert.equal(calls("hooks.pre_llm_call").length, 0);
await h.handlers.before_agent_start({ type: "before_agent_start", prompt: "first" }, ctx);
await h.handlers.before_agent_start({ type: "before_agent_start", prompt: "second" }, ctx);
assert.deepEqual(calls("hooks.pre_llm_call").map((c) => c.kwargs), [
	{ session_id: sid, user_message: "first", is_first_turn: true },
	{ session_id: sid, user_message: "second", is_first_turn: false },
]);

// Visibility commands.
assert.match(String(await h.commands.icarus("context status", ctx)), /hidden/);
assert.match(String(await h.commands.icarus("context show", ctx)), /visible/);
assert.match(String(await h.commands.icarus("context", ctx)), /hidden/);

// Startup defaults: the legacy alias read, a scoped toggle written, the session unchanged.
assert.match(String(await h.commands.icarus("context default status global", ctx)), /Startup default is hidden from global settings/);
const toggled = String(await h.commands.icarus("context default toggle global", ctx));
assert.match(toggled, /visible by default for future Pi sessions/);
assert.match(toggled, /Current session is still hidden/);
const global = JSON.parse(readFileSync(join(agentDir, "settings.json"), "utf8")).piIcarusHook;
assert.deepEqual(global, { hiddenDisplay: false, unrelated: "preserved", contextDisplay: true });
assert.match(String(await h.commands.icarus("context default show project", ctx)), /project settings/);
assert.equal(JSON.parse(readFileSync(join(project, ".pi", "settings.json"), "utf8")).piIcarusHook.contextDisplay, true);
const invalid = String(await h.commands.icarus("context default hide moon", ctx));
assert.match(invalid, /Usage/);

// Capture at settlement, with the final answer.
await h.handlers.agent_end({ type: "agent_end", messages: [{ role: "user", content: "hello" }, { role: "assistant", content: [{ type: "text", text: "world" }], stopReason: "stop" }] }, ctx);
assert.equal(calls("hooks.post_llm_call").length, 0);
await h.handlers.agent_settled({ type: "agent_settled" }, ctx);
await until("the capture", () => calls("hooks.post_llm_call").length > 0);
assert.deepEqual(calls("hooks.post_llm_call").map((c) => c.kwargs), [{ session_id: sid, user_message: "hello", assistant_response: "world", platform: "pi" }]);

// Tools: names, schema texts, validation before the backend, error envelopes, pass-through.
assert.deepEqual([...h.tools.keys()].sort(), ["fabric_brief", "fabric_curate", "fabric_init_obsidian", "fabric_pending", "fabric_recall", "fabric_search", "fabric_write", "icarus_hook_config"]);
const write = h.tools.get("fabric_write");
assert.deepEqual(write.parameters.properties.verified.enum, ["true", "false"]);
assert.match(write.parameters.properties.verified.description, /only when you verified/i);
assert.match(write.parameters.properties.evidence.description, /how the result was verified/i);
assert.match(write.parameters.properties.source_tool.description, /tool that produced/i);
assert.match(write.description, /verified/i);
assert.match(write.description, /evidence/i);
assert.match(write.promptSnippet, /verified/i);
assert.ok(!("limit" in h.tools.get("fabric_search").parameters.properties));
const writes = () => calls("tools.fabric_write").length;
const noEvidence = await write.execute("1", { type: "resolution", summary: "s", content: "c", verified: true });
assert.equal(noEvidence.isError, true);
assert.match(noEvidence.details.error, /requires evidence/);
const maybe = await write.execute("2", { type: "note", summary: "s", content: "c", verified: "maybe" });
assert.match(maybe.details.error, /verified must be/);
assert.equal(writes(), 0);
const written = await write.execute("3", { type: "note", summary: "s", content: "c", verified: "True", evidence: "checked", source_tool: "bash" });
assert.equal(written.isError, undefined);
assert.equal(written.details.status, "written");
assert.equal(calls("tools.fabric_write")[0].args[0].verified, "true");
const empty = await h.tools.get("fabric_search").execute("4", { query: "" });
assert.equal(empty.isError, true);
assert.equal(empty.details.error, "No query provided");
assert.match(empty.content[0].text, /No query provided/);
const schema = await h.tools.get("icarus_hook_config").execute("5", { schemaOnly: true });
assert.equal(schema.details.key, "piIcarusHook");
assert.equal(schema.details.runtimeEnv.ICARUS_DIR.default, "~/.hermes/plugins/icarus");

// Shutdown: on_session_end without `completed`, the footer cleared.
assert.equal(await h.handlers.session_shutdown({ type: "session_shutdown", reason: "reload" }, ctx), undefined);
assert.deepEqual(calls("hooks.on_session_end").map((c) => c.kwargs), [{ session_id: sid, platform: "pi" }]);
assert.equal(h.statuses.icarus, undefined);

// A Pi session without an id: Icarus gets "", and a repeated start is not deduplicated.
const anon = h.ctx("");
await h.handlers.session_start({ type: "session_start", reason: "new" }, anon);
await h.handlers.session_start({ type: "session_start", reason: "new" }, anon);
assert.deepEqual(calls("hooks.on_session_start").slice(1).map((c) => c.kwargs), [{ session_id: "", platform: "pi" }, { session_id: "", platform: "pi" }]);
await h.handlers.before_agent_start({ type: "before_agent_start", prompt: "anonymous" }, anon);
assert.equal(calls("hooks.pre_llm_call").at(-1).kwargs.session_id, "");
await h.handlers.session_shutdown({ type: "session_shutdown", reason: "quit" }, anon);

console.log("FAKE PI HOST OK");
process.exit(0);
