/**
 * castor Pi extension: embeds the castor runtime (`castor serve --stdio`) in Pi.
 *
 * - Lifecycle events go to castor as `harness.event` (session_start, before_agent_start,
 *   context, agent_end, agent_settled, session_shutdown); the results say what to inject.
 * - `/materia …`, `/icarus …` and `/castor status|restart` forward to castor methods.
 * - Fabric tools that castor announces are registered and forwarded as `icarus.tool`.
 * - castor's calls (`agent.run_turn`, `agent.abort_turn`, `session.append_entry`, `message.send`, `ui.notify`,
 *   `ui.status`, `classifier.complete`, `model.list`, `session.context_usage`, `session.compact`)
 *   act on Pi (compaction.ts: Pi's own `ctx.getContextUsage()` / `ctx.compact()`).
 *
 * Failure behaviour: every bridge call has a deadline. Lifecycle failures are ambient
 * (swallowed, Pi continues without the injection). When the runtime dies Pi shows an
 * error notification and the footer status `castor: down`; lifecycle events then fail
 * fast, and the next command respawns the runtime and reopens the session.
 *
 * Configuration (never from project files): which castor runs (locate.ts: flag `--castor-command`
 * / env `CASTOR_COMMAND`, else flag `--castor-python` / env `CASTOR_PYTHON` as `python -m castor`,
 * else `castor` on PATH), flag `--castor-timeout-ms` or env `CASTOR_TIMEOUT_MS` (default 15000),
 * flag `--materia-config PATH` (the session's explicit materia config layer, like pi-materia's flag;
 * castor itself also reads `MATERIA_CONFIG`).
 */
import { randomUUID } from "node:crypto";
import { accessSync, constants, statSync } from "node:fs";
import { VERSION, type ExtensionAPI } from "@mariozechner/pi-coding-agent";
import { castSessionName, completesCastIds, isNothingToActOn, materiaCompletions, planIcarus, planMateria, refusedArgumentText, resultText, runPlanned, runsWhileBusy, type CastRow, type Planned } from "./commands.ts";
import { compactionBegins, compactSession, contextUsage, type PiActivity } from "./compaction.ts";
import { cutText, flattenText, MAX_TURN_TEXT_BYTES, promptText, summarizeMessage, toPiCustomMessage } from "./messages.ts";
import { BEHIND_STOPPED_MS, boundedBehind, EscWatch, escIsAStop, type FocusView, holdWhileQuitting, StillBehind, StopKeyWatch } from "./interrupt.ts";
import { isStartLine, StderrRoute } from "./stderr.ts";
import { entryRefusal, RpcError, type Params, untilAborted } from "./rpc.ts";
import { locateCastor, parseEndpoint } from "./locate.ts";
import { listModels } from "./models.ts";
import { CastorRuntime, missingMethods, nextStepText, olderCastorText, opensOnStart, sessionIds, type Hello } from "./runtime.ts";
import { FabricTools } from "./tools.ts";
import { TurnTracker, type RunTurnParams, type TurnSettings } from "./turns.ts";

const EXTENSION_VERSION = "0.1.0";
const STATUS_KEY = "castor";
/** How long a silent castor gets to answer a probe before a hook skips it (at most the deadline). */
const PROBE_MS = 2000;
/** After a failed probe, hooks skip a silent castor without asking again for this long. */
const PROBE_REST_MS = 10_000;
/** Added to castor's own bound on a memory-backend call (`deadlines_ms`): the frames' way there and back. */
const DEADLINE_MARGIN_MS = 2000;
/** How long an aborted turn's end waits to tell an Esc from Pi shutting the session down. */
const QUIT_GRACE_MS = 50;
/** How long a refused turn end waits for castor's abort notice that may trail it. */
const ABORT_NOTICE_GRACE_MS = 500;
/** How long a session_start handler that saw Pi's quit keys holds Pi's start at most (see holdWhileQuitting). */
const QUIT_HOLD_MS = 5000;
/** How long a command that waits for idle also waits for the last run's settle to be emitted. */
const SETTLE_WAIT_MS = 2000;
/** How long after a /materia command an Esc during it still stops the turn it started (castor asks for it at once). */
const STOP_NEXT_TURN_MS = 3000;
/** How long before castor stops a turn to send it again (`cast_restarted`) an Esc still counts as meant for that turn. */
const RECENT_STOP_KEY_MS = 1000;
/** How long a turn waits for the compaction a run Pi stopped itself is expected to make way for. */
const COMPACTION_START_WAIT_MS = 1000;
/** How long a turn waits for the run of a prompt Pi began to send (its `input` event) to begin. */
const PROMPT_START_WAIT_MS = 2000;
const HAS_SETTLED = Number.parseInt(String(VERSION).split(".")[0] ?? "0", 10) >= 1;
const HARNESS_METHODS = [
	"agent.run_turn",
	"agent.abort_turn",
	"session.append_entry",
	"message.send",
	"ui.notify",
	"ui.status",
	"classifier.complete",
	"model.list",
	"session.context_usage",
	"session.compact",
];

type Ctx = any; // Pi's ExtensionContext (typed loosely: the extension runs on Pi 0.73 and 1.x)
type Level = "info" | "warning" | "error";

function errorText(err: unknown): string {
	return err instanceof Error ? err.message : String(err);
}

function isExecutable(file: string): boolean {
	try {
		accessSync(file, constants.X_OK);
		return statSync(file).isFile();
	} catch {
		return false;
	}
}

/** Pi's delivery modes for a message sent while a run streams; anything else is "not given". */
function deliveryMode(value: unknown): "steer" | "followUp" | "nextTurn" | undefined {
	return value === "steer" || value === "followUp" || value === "nextTurn" ? value : undefined;
}

export default function castorExtension(pi: ExtensionAPI): void {
	pi.registerFlag("castor-command", { type: "string", description: "Command that starts the castor runtime (default: castor serve --stdio, castor from PATH)" });
	pi.registerFlag("castor-python", { type: "string", description: "Python interpreter that has castor installed: runs <python> -m castor serve --stdio" });
	pi.registerFlag("castor-endpoint", { type: "string", description: "Connect to a running castor (unix:PATH or tcp:HOST:PORT) instead of starting one" });
	pi.registerFlag("castor-token-file", { type: "string", description: "File holding the token the castor endpoint requires (presented in runtime.hello)" });
	pi.registerFlag("materia-config", { type: "string", description: "Explicit materia config file for this session (relative to the project directory)" });
	pi.registerFlag("castor-timeout-ms", { type: "string", description: "Deadline for each castor call in ms (default 15000)" });

	let lastCtx: Ctx | undefined;
	/** The id castor knows this session by (Pi's own, or one made up when Pi has none: `sessionIds`). */
	let sessionId = "";
	/** Pi's own session id ("" when Pi gave none); castor's memory hooks use it. */
	let harnessId = "";
	let openedGeneration = -1;
	let runtime: CastorRuntime | undefined;
	/** The runtime was stopped because the session ended; cleared when one starts again. */
	let stoppedAtShutdown = false;

	/** Pi's run mode (`tui`, `rpc`, `json`, `print`; Pi 1.x) as `ctx` names it, if it does. */
	const modeOf = (ctx: Ctx): string | undefined => {
		try {
			return typeof ctx?.mode === "string" ? ctx.mode : undefined;
		} catch {
			return undefined; // a stale context (the session was replaced)
		}
	};
	// castor's stderr and these log lines: kept, and not drawn over Pi's terminal UI (stderr.ts).
	const stderr = new StderrRoute(() => modeOf(lastCtx));
	const log = (msg: string) => stderr.push(`[castor-pi] ${msg}\n`);
	/** castor's last stderr lines, for a notice (empty when there are none). The line a runtime on
	 * stdio prints as it starts says nothing the notice does not, so it is left out. */
	const stderrNote = () => {
		const lines = stderr.lastLines(3, (line) => !isStartLine(line));
		return lines.length ? ` castor's last stderr lines: ${lines.join(" / ")}` : "";
	};

	function ui(fn: (u: any) => void): void {
		try {
			if (lastCtx?.ui) fn(lastCtx.ui);
		} catch (err) {
			log(`ui call failed: ${errorText(err)}`); // a stale ctx after a session switch
		}
	}
	const notify = (message: string, level: Level = "info") => ui((u) => u.notify(message, level));
	const setStatus = (key: string, text: string | undefined) => ui((u) => u.setStatus(key, text));
	/** Footer entries castor set (a running cast's `materia-<id>`): a runtime that went away left them stale. */
	const castorStatusKeys = new Set<string>();
	function clearCastorStatuses(): void {
		for (const key of castorStatusKeys) setStatus(key, undefined);
		castorStatusKeys.clear();
	}

	const turns = new TurnTracker(pi, (text) => notify(`castor: ${text}`, "warning"));
	const tools = new FabricTools(pi, (name, params, toolCallId, signal) =>
		untilAborted(patientCall(getRuntime(), "icarus.tool", { session_id: sessionId, name, params, tool_call_id: toolCallId }), signal),
	);
	/** The longest castor waits on the memory backend per method (`icarus.config` `deadlines_ms`). */
	let backendDeadlines: Record<string, number> = {};
	function noteDeadlines(result: unknown): void {
		const d = (result as { deadlines_ms?: unknown } | null)?.deadlines_ms;
		if (d && typeof d === "object") backendDeadlines = Object.fromEntries(Object.entries(d).filter(([, v]) => typeof v === "number" && v > 0)) as Record<string, number>;
	}
	/** A call castor answers only once the memory backend has: its own bound, and a margin for the wire. */
	function deadlineFor(method: string): number {
		return Math.max(timeoutMs(), (backendDeadlines[method] ?? 0) + DEADLINE_MARGIN_MS);
	}

	/**
	 * A call castor may rightly take long over (it waits on the memory backend: `deadlineFor`), yet
	 * a castor that stopped answering must not cost that long. At each ordinary deadline
	 * (`--castor-timeout-ms`) still waiting, castor is probed (`runtime.hello`): answered, the
	 * wait goes on; not answered, the call fails now (and castor is marked not answering).
	 */
	async function patientCall(rt: CastorRuntime, method: string, params: Params, spawn?: boolean): Promise<unknown> {
		const longMs = deadlineFor(method);
		const step = timeoutMs();
		const work = rt.call(method, params, { spawn, timeoutMs: longMs });
		if (longMs <= step) return work;
		const done = work.then(() => true, () => true);
		for (;;) {
			let timer: ReturnType<typeof setTimeout> | undefined;
			const tick = new Promise<false>((resolve) => {
				timer = setTimeout(() => resolve(false), step);
			});
			const settled = await Promise.race([done, tick]);
			clearTimeout(timer);
			if (settled) return work;
			if (!(await rt.probe(probeMs()))) {
				throw new RpcError("timeout", `castor did not answer ${method} within ${step} ms and is not answering`);
			}
		}
	}

	/**
	 * Whether `err` is castor saying this session is not open (`not_found` naming it): castor gave up
	 * on it (its actors crashed past their supervisor's limit) and removed it, while this connection
	 * still used it. The next call opens it again (castor opens such an id afresh), and the user is
	 * told once per loss: a cast that ran in it is left for `/materia recast`. Before, every call
	 * answered "no open session" (shown as an info) and nothing reopened the session.
	 */
	function sessionLost(err: unknown): boolean {
		if (!(err instanceof RpcError) || err.code !== "not_found") return false;
		const named = (err.data as { session_id?: unknown } | undefined)?.session_id;
		if (named !== sessionId || !sessionId) return false;
		if (openedGeneration !== -1) {
			openedGeneration = -1;
			notify("castor lost this session (its actors failed and castor gave up on them): it is opened again. " +
				"A cast that ran in it is left orphaned; /materia recast resumes it.", "warning");
		}
		return true;
	}

	function stringFlag(name: string): string | undefined {
		const value = pi.getFlag(name);
		return typeof value === "string" && value.trim() ? value.trim() : undefined;
	}

	function timeoutMs(): number {
		const raw = pi.getFlag("castor-timeout-ms") || process.env.CASTOR_TIMEOUT_MS;
		const n = Number.parseInt(String(raw ?? ""), 10);
		return Number.isFinite(n) && n > 0 ? n : 15000;
	}

	function getRuntime(): CastorRuntime {
		if (runtime) return runtime;
		const endpointValue = stringFlag("castor-endpoint") || process.env.CASTOR_ENDPOINT;
		const endpoint = endpointValue ? parseEndpoint(endpointValue) : undefined;
		const located = endpoint
			? undefined
			: locateCastor({
					command: stringFlag("castor-command") || process.env.CASTOR_COMMAND,
					python: stringFlag("castor-python") || process.env.CASTOR_PYTHON,
					path: process.env.PATH,
					isExecutable,
				});
		runtime = new CastorRuntime({
			command: located?.argv ?? [],
			endpoint,
			tokenFile: stringFlag("castor-token-file") || process.env.CASTOR_TOKEN_FILE,
			cwd: lastCtx?.cwd ?? process.cwd(),
			timeoutMs: timeoutMs(),
			helloParams: { client: "pi", client_version: String(VERSION), protocol: 1, capabilities: HARNESS_METHODS },
			handlers: harnessHandlers(),
			// Nothing starts a castor for a session that is ending (a hook of its last run, one that
			// waited out a /castor restart's stop): it would outlive the session, serving nobody.
			mayStart: () => !closingSession,
			log,
			stderr: (text: string) => stderr.push(text),
			onUp: (hello: Hello, generation: number) => {
				setStatus(STATUS_KEY, `castor: up (${hello.version ?? "?"})`);
				// Not after a session's end stopped it (a host that keeps this instance for the next session):
				// nothing went wrong, the new session simply has its own.
				if (generation > 1 && !stoppedAtShutdown) notify(`castor runtime restarted (${hello.name ?? "castor"} ${hello.version ?? ""})`.trim(), "info");
				stoppedAtShutdown = false;
				tools.registerFrom(hello);
				const missing = missingMethods(hello);
				if (missing.length) notify(`${olderCastorText(hello, EXTENSION_VERSION, missing)}.`, "warning");
			},
			onSilence: (silent: boolean) => {
				if (silent) {
					setStatus(STATUS_KEY, "castor: not answering");
					notify(
						`castor is not answering (nothing from it within ${timeoutMs()} ms). Pi goes on without it: its hooks ` +
							`are skipped until it answers again. /castor status checks it, /castor restart restarts it.${stderrNote()}`,
						"warning",
					);
				} else {
					setStatus(STATUS_KEY, `castor: up (${runtime?.hello?.version ?? "?"})`);
					notify("castor is answering again", "info");
				}
			},
			onDown: (reason: string) => {
				setStatus(STATUS_KEY, "castor: down");
				clearCastorStatuses(); // nothing of castor's runs any more (a cast it ran is orphaned)
				const next = endpoint ? "reconnects" : "restarts it";
				notify(`castor runtime stopped: ${reason}. The next /materia, /icarus or /castor command ${next}.${stderrNote()}`, "error");
				orphanTurns(endpoint ? "lost its connection" : "stopped");
			},
		});
		return runtime;
	}

	/**
	 * The runtime went away (`cause`: it stopped, its connection was lost, the user restarted it)
	 * while turns it asked for ran or waited here: nothing can take their answers any more (the
	 * next runtime knows none of them). The running one is stopped now -- it would stream on to its
	 * end and be paid for, and its end then be refused -- the waiting ones are dropped, none is
	 * reported, and the user is told how to go on: the cast resumes from its saved state.
	 */
	function orphanTurns(cause: string): void {
		const { active, dropped } = turns.orphan();
		if (active === undefined && dropped.length === 0) return;
		if (active !== undefined) abortRun(lastCtx);
		const ids = [...(active !== undefined ? [active] : []), ...dropped];
		const what = ids.length === 1 ? `its turn ${ids[0]}` : `its turns ${ids.join(", ")}`;
		notify(`castor ${cause} while ${what} ${active !== undefined ? "ran" : "waited to run"}: the turn is stopped, as nothing ` +
			"could take its answer any more. The cast stays resumable: /materia recast runs the turn again.", "warning");
	}

	/** Runtime up + this session opened on the current runtime generation. */
	/** Take the session's ids from Pi's session manager (`sessionIds`). */
	function adoptSession(ctx: Ctx, shutDownSince: boolean): void {
		let piId = "";
		try {
			piId = String(ctx?.sessionManager?.getSessionId?.() ?? "");
		} catch {
			piId = "";
		}
		const ids = sessionIds(piId, { castorId: sessionId, harnessId }, shutDownSince, () => `pi-anon-${randomUUID()}`);
		sessionId = ids.castorId;
		harnessId = ids.harnessId;
	}

	async function ready(spawn: boolean): Promise<CastorRuntime> {
		// A command or event before any session_start (a host that emits none) still has a session.
		if (!sessionId) adoptSession(lastCtx, false);
		const rt = getRuntime();
		// An open that a /castor restart cut short (the runtime it was for stopped meanwhile) is done
		// again on the runtime that replaced it: it failed with an error toast ("session … is not
		// open on this connection") when the restart came right after castor's start.
		for (let attempt = 0; ; attempt++) {
			await rt.ensure(spawn);
			const generation = rt.generation;
			try {
				// One open per runtime and session, however many callers want it: a command that (re)started
				// the runtime and a hook of the run going on used to open the session twice, and castor
				// refused the second ("session … is already open on this connection", an error toast). A
				// caller that comes while the open is under way waits for it to be answered.
				const inFlight = opening?.generation === generation && opening.session === sessionId ? opening : undefined;
				if (inFlight) await inFlight.done;
				else if (openedGeneration !== generation) {
					const done = openSession(rt).finally(() => {
						if (opening?.done === done) opening = undefined;
					});
					opening = { generation, session: sessionId, done };
					await done;
				}
				return rt;
			} catch (err) {
				if (attempt < 2 && rt.generation !== generation) continue;
				throw err;
			}
		}
	}
	/** The session open under way: on which runtime generation, for which session (see `ready`). */
	let opening: { generation: number; session: string; done: Promise<void> } | undefined;

	async function openSession(rt: CastorRuntime): Promise<void> {
		// A session not opened yet on a castor that went silent (stopped before it answered the
		// open, or a new session on a stopped castor) is not asked again with a whole deadline by
		// every hook: it costs the quick probe, like any other call (`answering`).
		if (!(await answering(rt))) throw new RpcError("timeout", "castor is not answering: the session is not open on it yet; /castor restart restarts it");
		const generation = rt.generation;
		// Each call goes to the runtime the open is for: after a restart, the next one's connection
		// has not opened the session (castor refuses its calls), and its own open is under way.
		const same = () => {
			if (rt.generation !== generation) throw new RpcError("runtime_exited", "castor restarted while the session was being opened");
		};
		openedGeneration = generation;
		try {
			same();
			if (rt.has("session.open")) tools.registerFrom(await rt.call("session.open", sessionParams(), { spawn: false }));
			if (rt.has("icarus.config")) {
				same();
				const config = await rt.call("icarus.config", { session_id: sessionId }, { spawn: false });
				noteDeadlines(config);
				tools.registerFrom(config);
			}
		} catch (err) {
			if (openedGeneration === generation) openedGeneration = -1; // not the next runtime's open
			throw err;
		}
	}

	function sessionParams(): Params {
		const ctx = lastCtx;
		let trusted = false;
		try {
			trusted = typeof ctx?.isProjectTrusted === "function" ? Boolean(ctx.isProjectTrusted()) : false;
		} catch {
			trusted = false;
		}
		let sessionFile: string | null = null;
		try {
			sessionFile = ctx?.sessionManager?.getSessionFile?.() ?? null;
		} catch {
			sessionFile = null;
		}
		return {
			session_id: sessionId,
			cwd: ctx?.cwd ?? process.cwd(),
			trusted,
			flags: {
				harness: "pi",
				harness_version: String(VERSION),
				extension_version: EXTENSION_VERSION,
				has_agent_settled: HAS_SETTLED,
				harness_session_id: harnessId,
				session_file: sessionFile,
				...(stringFlag("materia-config") ? { materia_config: stringFlag("materia-config") } : {}),
			},
		};
	}

	/** When a probe of a silent castor last failed. */
	let lastFailedProbeAt = 0;

	/** A silent castor is asked this long whether it answers again before a hook skips it. */
	function probeMs(): number {
		return Math.min(PROBE_MS, timeoutMs());
	}

	/** Whether castor may be called now: not silent, or silent but answering a quick probe. A
	 * stopped castor then costs each hook the probe, not the whole deadline. */
	async function answering(rt: CastorRuntime): Promise<boolean> {
		if (!rt.silent) return true;
		// A probe that failed a moment ago is not repeated by every hook of the same turn (castor
		// speaking again clears its silence at once, whatever this remembers).
		if (Date.now() - lastFailedProbeAt < PROBE_REST_MS) return false;
		if (await rt.probe(probeMs())) return true;
		lastFailedProbeAt = Date.now();
		return false;
	}

	/** Forward a lifecycle event; ambient: any failure is logged and yields undefined. */
	async function forward(event: string, data: Params): Promise<Record<string, unknown> | undefined> {
		try {
			const rt = await ready(getRuntime().autoSpawn);
			if (!rt.has("harness.event")) return undefined;
			if (!(await answering(rt))) {
				log(`harness.event ${event} skipped: castor is not answering`);
				return undefined;
			}
			const result = await patientCall(rt, "harness.event", { session_id: sessionId, event, data }, false);
			applyEffects(result);
			return result !== null && typeof result === "object" ? (result as Record<string, unknown>) : undefined;
		} catch (err) {
			sessionLost(err); // the next call opens it again
			log(`harness.event ${event} failed: ${errorText(err)}`);
			return undefined;
		}
	}

	/** Effects any result may carry: `notify` ({message, level}), `status` ({key, text}), `tools`. */
	function applyEffects(result: unknown): void {
		if (result === null || typeof result !== "object") return;
		const r = result as Record<string, unknown>;
		const list = (v: unknown) => (Array.isArray(v) ? v : v ? [v] : []);
		for (const n of list(r.notify)) if (typeof n?.message === "string") notify(n.message, n.level ?? "info");
		for (const s of list(r.status)) if (typeof s?.key === "string") setStatus(s.key, typeof s.text === "string" ? s.text : undefined);
		tools.registerFrom(r);
	}

	function harnessHandlers(): Record<string, (p: Params) => unknown> {
		return {
			"agent.run_turn": async (p) => {
				const params = p as unknown as RunTurnParams;
				if (closingSession) {
					// Pi is ending this session (quit, /new, /resume, /fork): a run started now would go to
					// the model in a session being torn down, its answer read by nobody. Left unstarted and
					// unreported: castor closes the session with the turn pending, so the cast stays
					// resumable and a continue sends the turn again.
					log(`turn ${String(params.turn_id)} not started: the session is ending`);
					return;
				}
				if (compacting && !runUnsettled) {
					// Pi compacts the session (the user's /compact) with no run going on: a turn sent now
					// started a run at once, beside the compaction, with the context before it (Pi's own
					// prompts wait for the compaction's end). It waits for that end and is sent then; an
					// abort of it meanwhile (a crashed cast's actor restarted) leaves it unsent (dispatch).
					const epoch = sessionEpoch;
					log(`turn ${String(params.turn_id)} held until Pi's compaction ends`);
					await compactionEnded();
					await promptStarted(String(params.turn_id));
					if (closingSession || sessionEpoch !== epoch) {
						log(`turn ${String(params.turn_id)} not started: the session is ending`);
						return;
					}
				}
				try {
					await turns.dispatch(params, lastCtx);
					if (turns.isQueuedFollowUp(String(params.turn_id))) log(`turn ${String(params.turn_id)} queued as a follow-up (Pi is busy)`);
				} catch (err) {
					await reportTurn({
						session_id: sessionId,
						turn_id: String(params.turn_id),
						text: "",
						stop_reason: "error",
						error: `could not start the agent turn: ${errorText(err)}`,
						usage: { input: 0, output: 0, cache_read: 0, cache_write: 0, total_tokens: 0, cost: null },
						aborted: false,
						entry_id: null,
					});
				}
			},
			"agent.abort_turn": (p) => abortTurn(p),
			"session.append_entry": (p) => {
				if (typeof p.custom_type !== "string" || !p.custom_type) throw new RpcError("invalid_params", "custom_type must be a non-empty string");
				// Checked right before the append, which is synchronous: the acknowledgement leaves in
				// this same tick, so an entry appended here is one castor hears of before its deadline.
				const refusal = entryRefusal(p.expires_at_ms, Date.now());
				if (refusal) {
					log(`${p.custom_type} entry refused: ${refusal.message}`);
					throw refusal;
				}
				pi.appendEntry(p.custom_type, p.data ?? null);
				let entryId: string | null = null;
				try {
					entryId = lastCtx?.sessionManager?.getLeafId?.() ?? null;
				} catch {
					entryId = null;
				}
				return { ok: true, entry_id: entryId };
			},
			"message.send": (p) => {
				const msg = toPiCustomMessage(p, "castor");
				if (!msg) return;
				const trigger = p.trigger_turn === true;
				const deliverAs = deliveryMode(p.deliver_as) ?? (trigger && !lastCtx?.isIdle?.() ? "followUp" : undefined);
				pi.sendMessage(msg, { triggerTurn: trigger, ...(deliverAs ? { deliverAs } : {}) });
			},
			"ui.notify": (p) => notify(String(p.message ?? ""), p.level === "warning" || p.level === "error" ? p.level : "info"),
			"ui.status": (p) => {
				const key = String(p.key ?? STATUS_KEY);
				const text = typeof p.text === "string" ? p.text : undefined;
				if (key !== STATUS_KEY) {
					if (text === undefined) castorStatusKeys.delete(key);
					else castorStatusKeys.add(key);
				}
				setStatus(key, text);
			},
			"classifier.complete": (p) => classifierComplete(p),
			"model.list": () => modelList(),
			"session.context_usage": () => contextUsage(lastCtx),
			"session.compact": (p) => compactSession(lastCtx, p),
		};
	}

	async function reportTurn(outcome: Params): Promise<void> {
		if (typeof outcome.text === "string") {
			// An answer over what castor's wire carries would close the connection (and orphan the
			// cast): its first 6 MiB go, castor marks the output as cut, the user is told.
			const cut = cutText(outcome.text);
			if (cut.cutFrom !== undefined) {
				outcome = { ...outcome, text: cut.text, text_cut_from: cut.cutFrom };
				notify(`castor: the answer of turn ${String(outcome.turn_id)} is ${(cut.cutFrom / 1048576).toFixed(1)} MiB; ` +
					`castor keeps its first ${MAX_TURN_TEXT_BYTES / 1048576} MiB (cut, and marked so in the cast's output)`, "warning");
			}
		}
		try {
			await getRuntime().call("agent.turn_ended", outcome, { spawn: false });
		} catch (err) {
			// castor aborted this turn itself: it no longer waits for the end (it answers a late
			// one with {ok, ignored}; an older castor with not_found) — nothing to tell the user.
			// A not_found may overtake the abort notice on the wire: give that notice a moment.
			if (err instanceof RpcError && err.code === "not_found" && !turns.wasAborted(String(outcome.turn_id))) {
				await new Promise((resolve) => setTimeout(resolve, ABORT_NOTICE_GRACE_MS));
			}
			if (turns.wasAborted(String(outcome.turn_id))) {
				log(`end of aborted turn ${String(outcome.turn_id)} not taken: ${errorText(err)}`);
				return;
			}
			notify(`castor did not take the end of turn ${String(outcome.turn_id)}: ${errorText(err)}`, "error");
		}
	}

	/**
	 * `agent.abort_turn {session_id, turn_id, reason}` (notification): castor aborted the cast whose
	 * turn this is. The run in flight is aborted now (Pi's `ctx.abort()`; the outcome still goes out
	 * at settlement, `aborted: true`); a queued turn is dropped; an unknown or already ended turn is
	 * remembered only (so its late end raises no error toast).
	 */
	function abortTurn(p: Params): void {
		if (typeof p.turn_id !== "string" || !p.turn_id) throw new RpcError("invalid_params", "turn_id must be a non-empty string");
		if (typeof p.session_id === "string" && sessionId && p.session_id !== sessionId) return; // another session's turn
		const found = turns.abort(p.turn_id);
		log(`castor aborted turn ${p.turn_id} (${typeof p.reason === "string" ? p.reason : "no reason"}): ${found}`);
		if (found === "active") abortRun(lastCtx);
		if (p.reason === "cast_restarted") {
			// castor restarted the cast's crashed actor and sends the turn again under a new id: an Esc
			// from now until that turn's run starts -- or one just before, which stopped the old run
			// as castor stopped it -- is for the re-sent turn, which is stopped as it starts.
			restartWindowUntil = Date.now() + STOP_NEXT_TURN_MS;
			if (Date.now() - lastStopKey.at < RECENT_STOP_KEY_MS) stopResentTurn(lastStopKey.cause);
		}
	}

	/** Until when an Esc is for the turn a restarted cast sends again (see `abortTurn`). */
	let restartWindowUntil = 0;
	/** The last Esc (or RPC abort) Pi's keys or input carried, and when. */
	let lastStopKey: { at: number; cause: "esc" | "abort" } = { at: 0, cause: "esc" };
	/** What the notice of a stopped castor turn says (see `before_agent_start`). */
	let stopNextTurnNotice = "";

	function stopResentTurn(cause: "esc" | "abort"): void {
		restartWindowUntil = 0;
		stopNextTurnUntil = Date.now() + STOP_NEXT_TURN_MS;
		stopNextTurnNotice = `castor: ${cause === "esc" ? "Esc" : "abort"} — castor restarted the cast's crashed actor and ` +
			"sent its turn again as you stopped it: that turn is stopped too (/materia continue runs it)";
	}

	/** When a stop key last came while Pi compacted inside a run (its auto-compaction). */
	let compactionKeyAt = 0;

	function onStopKey(cause: "esc" | "abort"): void {
		if (compacting && runUnsettled) {
			// Pi compacts on its own inside a run (the context near full): the key goes to the
			// compaction, as during the user's /compact. Pi's terminal cancels only the compaction; its
			// RPC abort stops the run too. Either way no castor turn waiting for the compaction's end is
			// stopped: one whose prompt that run was about to send is sent again when it settles (the
			// context event). A castor turn whose own run Pi stops is stopped with it, as ever.
			compactionKeyAt = Date.now();
			log(`${cause === "esc" ? "Esc" : "abort"} while Pi compacts in a run: it goes to the compaction, no castor turn waiting for it is stopped`);
			return;
		}
		if (!runUnsettled && piCompacting()) {
			// Pi compacts with no run going on (the user's /compact, an RPC compact): its interrupt
			// cancels the compaction, and only that -- the prompts Pi queued meanwhile are sent then.
			// So is a castor turn held for the compaction's end: the key stops no turn (before, one
			// within a restarted cast's window, or right after a turn answered, stopped the turn held).
			log(`${cause === "esc" ? "Esc" : "abort"} while Pi compacts: it cancels the compaction, no castor turn is stopped`);
			return;
		}
		lastStopKey = { at: Date.now(), cause };
		if (Date.now() < restartWindowUntil) stopResentTurn(cause);
		else if (Date.now() - castorTurnAnsweredAt < RECENT_STOP_KEY_MS && !runUnsettled && !turns.active) {
			// A castor turn has just answered and no run goes on: castor is sending the cast's next
			// turn. Pi's abort found nothing to stop, and that turn then ran as if no key had been
			// pressed: it is stopped as it starts, as an Esc during it would have. (A utility socket
			// next is not stopped by an Esc at all: sayWhatStopsAUtility says so and ends this.)
			castorTurnAnsweredAt = 0;
			stopNextTurnUntil = Date.now() + STOP_NEXT_TURN_MS;
			stopNextTurnNotice = `castor: ${cause === "esc" ? "Esc" : "abort"} — the cast's next turn, which castor sent as ` +
				"the last one answered, is stopped (/materia continue runs it)";
			gapStopArmed = true;
		}
	}
	/** When a castor turn last settled with its answer (0: a run started since). */
	let castorTurnAnsweredAt = 0;
	/** The stop armed is the one for the cast's next turn after an answer (see onStopKey). */
	let gapStopArmed = false;

	/** The running agent's abort signal (Pi 1.x `ctx.signal`), if there is one. */
	function runSignal(ctx: Ctx): AbortSignal | undefined {
		try {
			const signal = ctx?.signal;
			return signal instanceof AbortSignal ? signal : undefined;
		} catch {
			return undefined; // a stale ctx
		}
	}

	/** The extension stopped the run going on (or about to start): for castor, or at a withdrawn turn's prompt. */
	let extensionStoppedRun = false;
	function abortRun(ctx: Ctx): void {
		extensionStoppedRun = true;
		try {
			ctx?.abort?.();
		} catch (err) {
			log(`abort failed: ${errorText(err)}`); // a stale ctx: the run it belonged to is gone
		}
	}

	async function classifierComplete(p: Params): Promise<unknown> {
		const registry = lastCtx?.modelRegistry;
		if (typeof registry?.complete !== "function" || typeof registry?.find !== "function") {
			throw new RpcError("unsupported", "this Pi has no model registry completion API (needs Pi >= 1.0)");
		}
		const model = registry.find(String(p.provider ?? ""), String(p.model ?? ""));
		if (!model) throw new RpcError("not_found", `model ${String(p.provider)}/${String(p.model)} is not in Pi's registry`);
		const prompt = typeof p.prompt === "string" ? p.prompt : "";
		const messages = Array.isArray(p.messages)
			? p.messages.map((m: any) => ({ role: m?.role === "assistant" ? "assistant" : "user", content: [{ type: "text", text: flattenText(m?.content) }], timestamp: Date.now() }))
			: [{ role: "user", content: [{ type: "text", text: prompt }], timestamp: Date.now() }];
		const limitMs = typeof p.timeout_ms === "number" && p.timeout_ms > 0 ? p.timeout_ms : timeoutMs();
		const options: Record<string, unknown> = { signal: AbortSignal.timeout(limitMs) };
		if (typeof p.max_tokens === "number") options.maxTokens = p.max_tokens;
		if (typeof p.temperature === "number") options.temperature = p.temperature;
		const reply = await registry.complete(model, { systemPrompt: typeof p.system === "string" ? p.system : undefined, messages }, options);
		if (reply?.stopReason === "error" || reply?.stopReason === "aborted") {
			throw new RpcError(reply.stopReason === "aborted" ? "timeout" : "provider_error", "classifier model call failed", { stop_reason: reply.stopReason });
		}
		const u = reply?.usage ?? {};
		return {
			text: flattenText(reply?.content),
			stop_reason: reply?.stopReason ?? null,
			provider: model.provider,
			model: model.id,
			usage: { input: u.input ?? null, output: u.output ?? null, cache_read: u.cacheRead ?? null, cache_write: u.cacheWrite ?? null, total_tokens: u.totalTokens ?? null, cost: u.cost?.total ?? null },
		};
	}

	function modelList(): unknown {
		return listModels(lastCtx?.modelRegistry, lastCtx?.model);
	}

	/** Run a command; its reply is notified and returned (the handler's result, as in pi-icarus-hook). */
	async function runCommand(planned: Planned, ctx: Ctx, label: string): Promise<string> {
		lastCtx = ctx;
		return runPlanned(
			planned,
			async (method, params) => {
				// After the session's start event, which in RPC mode may still be on its way (session_start).
				if (startupPending) await startupWait;
				const rt = await ready(true);
				// A castor a deadline found silent (stopped, wedged) is asked the quick probe first: each
				// command used to wait out the whole deadline again, however often it was typed.
				if (!(await answering(rt))) {
					throw new RpcError("timeout", `castor is not answering (nothing from it within ${probeMs()} ms); /castor restart restarts it`);
				}
				const call = (on: CastorRuntime) => on.call(method, { session_id: sessionId, cwd: ctx.cwd, ...params }, { spawn: false });
				let result: unknown;
				try {
					result = await call(rt);
				} catch (err) {
					if (!sessionLost(err)) throw err;
					result = await call(await ready(true)); // opened again: the command is asked once more
				}
				applyEffects(result);
				if (method === "cast.start" && typeof params.request === "string") nameSession(params.request);
				return result;
			},
			(text, level) => notify(text, level),
			(err) =>
				err instanceof RpcError && isNothingToActOn(planned, err.code)
					? { text: err.message, level: "info" } // pi-materia's notice: nothing to act on
					: err instanceof RpcError && err.code === "invalid_params" && refusedArgumentText(planned, err.data)
						? { text: `${label}: ${refusedArgumentText(planned, err.data)} [${err.code}]`, level: "warning" } // the user's typing, not a failure
					: err instanceof RpcError && err.code === "unknown_method" && "method" in planned
						? `${label}: ${olderCastorText(getRuntime().hello, EXTENSION_VERSION, [planned.method])} [${err.code}]`
						: `${label}: ${errorText(err)}${err instanceof RpcError ? ` [${err.code}]` : ""}` +
							// why it exited ("No module named castor": a --castor-python without castor)
							(err instanceof RpcError && err.code === "runtime_exited" && stderrNote() ? `.${stderrNote()}` : "") +
							nextStepText(err),
		);
	}

	/** A started cast names Pi's session after its request (`materia: <request>`), as pi-materia does. */
	function nameSession(request: string): void {
		try {
			if (typeof pi.setSessionName === "function") pi.setSessionName(castSessionName(request));
		} catch {
			// an older Pi without session names: the cast runs all the same
		}
	}

	/**
	 * `/materia` argument completions. Cast ids come from `cast.list`, kept from the last answer
	 * (fetched after every `/materia` command, and again in the background on each completion), so
	 * a completion answers at once; only the first one, before any list, waits for it. Only a
	 * castor already running is asked: a keystroke never starts one.
	 */
	let castRows: CastRow[] | null = null;
	let castRowsCwd: string | undefined;

	async function refreshCastRows(): Promise<CastRow[] | null> {
		const ctx = lastCtx;
		if (!ctx) return null;
		try {
			const rt = await ready(false);
			if (rt.silent) return castRows; // not asked again while castor does not answer (`answering`)
			// A quick refresh: a castor busy past its 2 s (a loaded machine) is not thereby "not
			// answering" (it used to be: the next command then failed after a probe, not a deadline).
			const listed = (await rt.call("cast.list", { session_id: sessionId, cwd: ctx.cwd },
				{ spawn: false, timeoutMs: probeMs(), marksSilence: false })) as { casts?: unknown };
			castRows = Array.isArray(listed?.casts) ? (listed.casts as CastRow[]) : null;
			castRowsCwd = ctx.cwd;
		} catch {
			castRows = null;
		}
		return castRows;
	}

	function materiaArgumentCompletions(prefix: string): ReturnType<typeof materiaCompletions> | Promise<ReturnType<typeof materiaCompletions>> {
		if (!completesCastIds(prefix)) return materiaCompletions(prefix, null);
		if (castRows !== null && castRowsCwd === lastCtx?.cwd) {
			const answer = materiaCompletions(prefix, castRows);
			void refreshCastRows();
			return answer;
		}
		return refreshCastRows().then((rows) => materiaCompletions(prefix, rows));
	}

	async function waitIdle(ctx: Ctx): Promise<void> {
		if (typeof ctx?.waitForIdle === "function") await ctx.waitForIdle();
	}

	// Pi's command handlers return nothing; these also return the text they showed, as
	// pi-icarus-hook's and pi-materia's handlers do (their callers and tests read it; Pi ignores it).
	const replying = (fn: (args: string, ctx: Ctx) => Promise<string>) =>
		fn as unknown as (args: string, ctx: Ctx) => Promise<void>;

	pi.registerCommand("materia", {
		description: "castor materia casts: cast, continue, abort, recast, revive, status, casts, grid, loadout",
		getArgumentCompletions: (prefix: string) => materiaArgumentCompletions(prefix ?? ""),
		handler: replying(async (args: string, ctx: Ctx) => {
			const planned = planMateria(args ?? "");
			// abort and the read-only commands answer while a turn runs; the others start or
			// resume turns, so they wait until Pi is idle and the last run's end has reached castor
			// (an Esc's end is held QUIT_GRACE_MS: a continue sent before it would be refused
			// "already awaiting").
			const startsTurns = !runsWhileBusy(planned);
			if (startsTurns) {
				await waitIdle(ctx);
				await endsReported();
				if (gapStopArmed) {
					// A key pressed as the cast's last turn answered was not meant for the turn this command starts.
					gapStopArmed = false;
					stopNextTurnUntil = 0;
					stopNextTurnNotice = "";
				}
			}
			// An Esc (or RPC abort) while castor answers a command that starts a turn (cast, continue,
			// recast, revive) came before there was a run to stop: Pi's abort did nothing, and the
			// turn the command started then ran. It is now stopped as it starts, as an Esc during it
			// would have (the cast is interrupted; /materia continue runs it).
			const esc = startsTurns ? new EscWatch(ctx, Date.now, process, escIsStop(ctx)) : undefined;
			esc?.signal?.addEventListener("abort", () => {
				// A run going on, or a turn already bound, is Pi's own abort to stop.
				if (!esc.quitting && !runUnsettled && !turns.active) {
					stopNextTurnUntil = Number.POSITIVE_INFINITY;
					stopNextTurnNotice = "";
				}
			}, { once: true });
			let reply: string;
			try {
				reply = await runCommand(planned, ctx, "materia");
			} finally {
				// castor asks for the turn as it answers: it may come a moment after the command's answer.
				if (stopNextTurnUntil === Number.POSITIVE_INFINITY) stopNextTurnUntil = Date.now() + STOP_NEXT_TURN_MS;
				esc?.dispose();
			}
			if (!("usage" in planned)) await refreshCastRows(); // what recast/revive complete to now
			return reply;
		}),
	});

	pi.registerCommand("icarus", {
		description: "Icarus memory hooks: on, off, toggle, status, context …, config, schema",
		handler: replying(async (args: string, ctx: Ctx) => runCommand(planIcarus(args ?? ""), ctx, "icarus")),
	});

	pi.registerCommand("castor", {
		description: "castor runtime: status | restart",
		handler: async (args: string, ctx: Ctx) => {
			lastCtx = ctx;
			const sub = (args ?? "").trim();
			try {
				if (sub === "restart") {
					const epoch = sessionEpoch;
					orphanTurns("restarted");
					await getRuntime().stop();
					clearCastorStatuses();
					openedGeneration = -1;
					if (closingSession || sessionEpoch !== epoch) {
						// The session ended while castor stopped (Pi quit, or /new, /resume, /fork replaced
						// it): a castor started now would serve nobody -- this instance is never called
						// again -- and stayed under Pi, with its workers, until Pi quit.
						log("castor restart: the session ended while castor stopped; no castor is started for it");
						return;
					}
				} else if (sub !== "" && sub !== "status") {
					notify("Usage: /castor status | restart", "warning");
					return;
				}
				const rt = await ready(true);
				const where = rt.endpoint ? `at ${rt.endpoint}` : `pid ${rt.pid ?? "?"}`;
				if (!(await rt.probe(probeMs()))) {
					// Asked, not remembered: a stopped castor is still "up" until it answers nothing.
					notify(`castor ${rt.hello?.version ?? "?"} is not answering (${where}: nothing within ${probeMs()} ms). ` +
						`/castor restart restarts it.${stderrNote()}`, "warning");
					return;
				}
				notify(`castor ${rt.hello?.version ?? "?"} up (${where}, ${rt.hello?.methods?.length ?? 0} methods).${stderrNote()}`, "info");
			} catch (err) {
				notify(`castor: ${errorText(err)}${nextStepText(err) ? `.${nextStepText(err)}` : ""}`, "error");
			}
		},
	});

	/**
	 * An Esc (or an RPC client's `abort`) while Pi is idle finds no run to stop: while a cast's
	 * utility command ran, it said nothing and the command ran on. castor is asked whether the
	 * session's live cast waits for a utility command; if so the user is told, once per command,
	 * that the command runs on and what stops it. Asked only while a castor footer is shown (a cast
	 * runs) and castor answers; a castor that does not answer at once is not waited for.
	 */
	let stopKeys: StopKeyWatch | undefined;
	let utilityNoticed: string | undefined;

	async function sayWhatStopsAUtility(cause: "esc" | "abort"): Promise<void> {
		const ctx = lastCtx;
		const rt = runtime;
		if (!ctx || closingSession || !rt?.isUp || rt.silent) return;
		try {
			if (!ctx.isIdle()) return; // a run streams: Pi's own Esc stops it
		} catch {
			return; // a stale context: the session went away
		}
		if (![...castorStatusKeys].some((key) => key === "materia" || key.startsWith("materia-"))) return;
		let view: any;
		try {
			view = await rt.call("cast.status", { session_id: sessionId, cwd: ctx.cwd }, { spawn: false, timeoutMs: probeMs() });
		} catch {
			return; // castor busy or gone: nothing is said
		}
		const pending = view?.pending;
		if (view?.live !== true || pending?.kind !== "utility" || typeof pending.visit_id !== "string") return;
		if (gapStopArmed) {
			// The cast went on to a utility socket, which the key does not stop: neither is the turn after it.
			gapStopArmed = false;
			stopNextTurnUntil = 0;
			stopNextTurnNotice = "";
		}
		if (pending.visit_id === utilityNoticed) return;
		utilityNoticed = pending.visit_id;
		const key = cause === "esc" ? "Esc" : "abort";
		notify(`castor: ${key} does not stop ${String(pending.socket_id)}'s command (a utility socket): it runs on. ` +
			"/materia abort stops the cast and its command; /materia recast then runs the command again.", "info");
	}

	/**
	 * Pi's terminal UI, to tell the user's Esc from one a picker or dialog takes (escIsAStop): Pi hands
	 * it to the factory of an extension's widget, and a widget of no lines under the editor shows
	 * nothing. Only in the interactive mode (the RPC mode ignores a widget factory); nothing where Pi
	 * has no such widget: every Esc is a stop there, as before.
	 */
	function watchFocus(ctx: Ctx): () => FocusView | undefined {
		let view: FocusView | undefined;
		try {
			if (ctx?.hasUI && modeOf(ctx) !== "rpc" && typeof ctx.ui?.setWidget === "function") {
				ctx.ui.setWidget("castor-keys", (tui: FocusView) => {
					view = tui;
					return { render: () => [], invalidate: () => undefined };
				}, { placement: "belowEditor" });
			}
		} catch (err) {
			log(`no view of Pi's focus: ${errorText(err)}`);
		}
		return () => view;
	}

	/** Pi's terminal UI as the session's `watchFocus` got it. */
	let focusView: () => FocusView | undefined = () => undefined;
	/** Whether an Esc pressed now is the user's stop (escIsAStop), for a key watch of `ctx`'s. */
	function escIsStop(ctx: Ctx): () => boolean | undefined {
		const busy = () => {
			try {
				return !ctx.isIdle();
			} catch {
				return false; // a stale context
			}
		};
		return () => {
			const verdict = escIsAStop(focusView(), busy);
			if (verdict !== undefined || !focusView()) return verdict;
			// The TUI seen has no focus: Pi swapped it for another (its TUI mode changed). The widget,
			// set again, is handed the one Pi draws now.
			focusView = watchFocus(lastCtx ?? ctx);
			return escIsAStop(focusView(), busy);
		};
	}

	pi.on("session_start", async (event: any, ctx: Ctx) => {
		lastCtx = ctx;
		stopKeys?.dispose();
		focusView = watchFocus(ctx);
		stopKeys = new StopKeyWatch(ctx, (cause) => {
			onStopKey(cause);
			void sayWhatStopsAUtility(cause);
		}, process, escIsStop(ctx));
		const previousId = sessionId;
		adoptSession(ctx, closingSession);
		// A new or replaced session must be opened again; the same one started twice is open already.
		if (opensOnStart(previousId, sessionId, closingSession)) openedGeneration = -1;
		closingSession = false;
		const epoch = sessionEpoch;
		const startup = (async () => {
			try {
				await ready(true);
			} catch (err) {
				if (closingSession || sessionEpoch !== epoch) return; // Pi quit while castor started: nothing to tell
				// A deadline that passed has marked castor "not answering" (it is wedged, not down): the footer says so.
				if (!(err instanceof RpcError && err.code === "timeout")) setStatus(STATUS_KEY, "castor: down");
				const code = err instanceof RpcError ? ` [${err.code}]` : "";
				notify(`castor runtime unavailable: ${errorText(err)}${code}.${stderrNote()}${nextStepText(err)}`, "error");
				return;
			}
			const result = await forward("session_start", { reason: event?.reason ?? null, previous_session_file: event?.previousSessionFile ?? null });
			const msg = toPiCustomMessage(result?.message, "castor-session-context");
			if (msg && !closingSession && sessionEpoch === epoch) pi.sendMessage(msg, { triggerTurn: false });
		})();
		startupPending = true;
		startupWait = startup.catch(() => undefined).finally(() => {
			if (sessionEpoch === epoch) startupPending = false;
		});
		if (modeOf(ctx) === "rpc") {
			// Pi's RPC mode reads no command -- not an `abort`, not the end of its input -- until this
			// handler returns: held here, an abort and a quit waited for castor's whole start (a
			// cold start, a slow memory backend, a whole deadline for a castor that hangs). castor
			// starts behind it instead; a prompt's `before_agent_start` waits for the start, where
			// an RPC abort (or the end of Pi's input) ends the wait, and a quit stops castor starting.
			return;
		}
		// Pi holds a submitted prompt until this handler returns, and castor's start (a cold start, a
		// slow memory backend's session start) may take seconds -- up to a whole deadline for a castor
		// that hangs. An Esc then found no run to stop, and the prompt it was meant for ran once castor
		// was up. Now an Esc ends the wait (castor goes on starting behind it) and a prompt submitted
		// before it is stopped when its run starts. Pi's quit keys end the wait too, but the handler
		// does not return while Pi quits (holdWhileQuitting).
		const esc = new EscWatch(ctx, Date.now, process, escIsStop(ctx));
		try {
			await untilAborted(startup, esc.signal);
		} catch (err) {
			if (!esc.pressed) throw err;
			if (esc.quitting) {
				// Returned now, Pi went on with the rest of its own start before its quit.
				await holdWhileQuitting(startup, () => closingSession, QUIT_HOLD_MS);
				return;
			}
			if (esc.promptPending) stopPromptHeldAtStart = true;
			const key = esc.cause === "abort" ? "abort" : "Esc";
			notify(`castor: ${key} — stopped waiting for castor to start` +
				(esc.promptPending ? "; the prompt sent meanwhile is stopped" : " (it goes on starting)"), "info");
		} finally {
			esc.dispose();
		}
	});
	/** castor's start for this session (spawn, handshake, open, its session-start event); settles, never rejects. */
	let startupWait: Promise<void> | undefined;
	/** That start is still under way (in RPC mode it goes on behind Pi's; see session_start). */
	let startupPending = false;
	/** Until when (ms) the next castor turn is stopped as it starts: an Esc came while a /materia command that starts one was answered. */
	let stopNextTurnUntil = 0;
	/** An Esc while castor started came after a prompt Pi held: that prompt's run is stopped when it starts. */
	let stopPromptHeldAtStart = false;
	/**
	 * The `before_agent_start` call (a memory retrieval) whose wait an Esc ended, until castor answers
	 * it: castor answers it before the next prompt's, so that prompt waits for it at most
	 * {@link BEHIND_STOPPED_MS} and then goes without castor's answer (it used to wait the whole
	 * retrieval out, a hung one up to its deadline).
	 */
	let retrievalAhead: Promise<void> | undefined;
	function leaveBehind(call: Promise<unknown>): void {
		const settled = call.then(() => undefined, () => undefined);
		retrievalAhead = settled;
		void settled.then(() => {
			if (retrievalAhead === settled) retrievalAhead = undefined;
		});
	}

	/** The run about to start had its before_agent_start (see TurnTracker.bindOnAgentStart). */
	let beforeStartSeen = false;
	pi.on("before_agent_start", async (event: any, ctx: Ctx) => {
		lastCtx = ctx;
		beforeStartSeen = true;
		extensionStoppedRun = false; // a run begins: what stopped the last one is over
		promptStartingUntil = 0; // the prompt's run begins: Pi is busy from now on
		const custom = event?.messageType === "custom";
		if (custom && turns.isAbortedMessage(event.message)) {
			// The hidden prompt of a turn castor aborted while Pi held it: stop the run before its
			// first request (Pi aborts a run at agent_start when asked during before_agent_start).
			abortRun(ctx);
			return undefined;
		}
		if (!custom && stopPromptHeldAtStart) {
			// The prompt submitted while castor started, which the user's Esc was meant for (the
			// notice said so): stopped before its first model request (Pi aborts it at agent_start).
			stopPromptHeldAtStart = false;
			abortRun(ctx);
			return undefined;
		}
		const armed = Date.now() < stopNextTurnUntil;
		if (!custom) stopNextTurnUntil = 0; // a prompt of the user's own: the Esc was not meant for later turns
		gapStopArmed = false;
		if (custom && turns.bindFromMessage(event.message)) {
			restartWindowUntil = 0; // a castor turn runs: an Esc now is Pi's own to stop it
			if (armed) {
				stopNextTurnUntil = 0;
				// The turn a /materia command started, with an Esc while castor answered the command -- or the
				// turn a restarted cast sent again, with an Esc as castor stopped its run: stopped before its
				// first model request and reported interrupted, as an Esc during the turn is.
				notify(stopNextTurnNotice || "castor: Esc — the turn the command started is stopped (/materia continue runs it)", "info");
				stopNextTurnNotice = "";
				turns.stoppedBeforeRequest();
				abortRun(ctx);
				return undefined;
			}
		}
		// An Esc while castor answers (a memory retrieval may take seconds) ends the wait: Pi holds
		// its abort until this handler returns (interrupt.ts). So do Pi's quit keys, the signals it
		// shuts down on and, in RPC mode, its input ending or an RPC abort: each waits for this handler.
		const esc = new EscWatch(ctx, Date.now, process, escIsStop(ctx));
		let result: Record<string, unknown> | undefined;
		let call: Promise<Record<string, unknown> | undefined> | undefined;
		try {
			// After castor's start (the session's start event first), which in RPC mode goes on behind
			// Pi's: the wait for it ends at an abort as the wait for the answer does.
			const started = startupWait;
			call = (started ?? Promise.resolve()).then(() => forward("before_agent_start", {
				prompt: custom ? null : promptText(event?.prompt),
				message_type: custom ? "custom" : "user",
				custom_type: custom ? (event.message?.customType ?? null) : null,
				turn_id: turns.active?.turnId ?? null,
				system_prompt: typeof event?.systemPrompt === "string" ? event.systemPrompt : null,
				images: Array.isArray(event?.images) ? event.images.length : 0,
			}));
			// A user's prompt does not wait out a retrieval an Esc left running (castor answers that
			// one first); a castor turn's answer is the turn's own, and is waited for as ever.
			result = await untilAborted(boundedBehind(call, custom ? undefined : retrievalAhead, BEHIND_STOPPED_MS), esc.signal);
		} catch (err) {
			if (err instanceof StillBehind && !esc.pressed) {
				leaveBehind(call!);
				notify(`castor: this prompt goes without memory context: the retrieval an Esc stopped waiting for still ` +
					`runs, and castor answers it first (waited ${BEHIND_STOPPED_MS / 1000} s)`, "info");
				return undefined;
			}
			if (!esc.pressed) throw err;
			if (call && !esc.quitting) leaveBehind(call);
			if (esc.quitting) {
				quitting = true; // the shutdown that follows does not wait behind this retrieval either
				return undefined;
			}
			const key = esc.cause === "abort" ? "abort" : "Esc";
			notify(custom ? `castor: ${key} — stopped waiting for castor's answer to this turn`
				: `castor: ${key} — stopped waiting for this prompt's memory context`, "info");
			return undefined;
		} finally {
			esc.dispose();
		}
		if (!result) return undefined;
		const out: Record<string, unknown> = {};
		let systemPrompt = typeof result.system_prompt === "string" ? result.system_prompt : undefined;
		if (typeof result.system_prompt_append === "string" && result.system_prompt_append) {
			systemPrompt = `${systemPrompt ?? event?.systemPrompt ?? ""}${result.system_prompt_append}`;
		}
		if (systemPrompt !== undefined) out.systemPrompt = systemPrompt;
		if (!custom && result.turn_settings !== null && typeof result.turn_settings === "object") {
			// A user-driven refinement turn: the materia's model, thinking and tool scope apply to
			// this run (Pi reads them after before_agent_start); the tool scope is restored at settle.
			await turns.applyUserTurn(result.turn_settings as TurnSettings, ctx, (text) => notify(`castor: ${text}`, "warning"));
		}
		const message = toPiCustomMessage(result.message, "castor-context");
		if (message) out.message = message;
		return Object.keys(out).length ? out : undefined;
	});

	pi.on("agent_start", (_event: any, ctx: Ctx) => {
		lastCtx = ctx;
		runUnsettled = true;
		runStartedAt = Date.now();
		castorTurnAnsweredAt = 0;
		turns.bindOnAgentStart(beforeStartSeen);
		beforeStartSeen = false;
	});

	pi.on("context", async (event: any, ctx: Ctx) => {
		lastCtx = ctx;
		let messages: unknown[] = Array.isArray(event?.messages) ? event.messages : [];
		const bound = turns.bindFromContext(messages);
		if (bound === "aborted") abortRun(ctx); // a follow-up turn castor aborted
		if (bound === "bound" && compactionKeyAt >= runStartedAt && runSignal(ctx)?.aborted) {
			// The turn's prompt goes out in a run Pi stopped with the key that went to its compaction
			// (an RPC abort while Pi compacted before sending it): it never reaches the model. It
			// waits again and is sent again once the run settles; it was reported interrupted.
			log(`turn ${turns.requeueUnrequested()} not started: the run was stopped by the key that cancelled Pi's compaction; it is sent again`);
			return undefined;
		}
		if (bound === "bound") {
			// A castor turn delivered inside the run going on (a follow-up): an Esc now is Pi's own to
			// stop it; one armed for the turn a restarted cast sent again stops it before its request.
			restartWindowUntil = 0;
			if (Date.now() < stopNextTurnUntil && stopNextTurnNotice) {
				stopNextTurnUntil = 0;
				notify(stopNextTurnNotice, "info");
				stopNextTurnNotice = "";
				turns.stoppedBeforeRequest();
				abortRun(ctx);
			}
		}
		const reordered = turns.leftoversFirst(messages);
		if (reordered) messages = reordered;
		const isolated = turns.isolate(messages);
		if (process.env.CASTOR_PI_DEBUG) log(`context: turn=${turns.active?.turnId} isolate=${turns.active?.isolate} n=${messages.length} isolated=${isolated?.length} ${JSON.stringify(messages.map((m: any) => [m.role, m.customType, m.details]))}`);
		let result: Record<string, unknown> | undefined;
		try {
			// castor may take seconds here (a context filter asks a classifier). Pi gives this event the
			// run's abort signal and waits for the handler before the run can end: an Esc or an RPC
			// abort used to wait for castor's answer. Now the wait ends with the run; the answer is dropped.
			result = await untilAborted(forward("context", { turn_id: turns.active?.turnId ?? null, messages: isolated ?? messages }), runSignal(ctx));
		} catch {
			log("context: the run was aborted while castor answered; its answer is dropped");
			return isolated ? { messages: isolated } : reordered ? { messages } : undefined;
		}
		if (Array.isArray(result?.messages)) return { messages: result.messages };
		return isolated ? { messages: isolated } : reordered ? { messages } : undefined;
	});

	pi.on("agent_end", async (event: any, ctx: Ctx) => {
		lastCtx = ctx;
		const messages: unknown[] = Array.isArray(event?.messages) ? event.messages : [];
		turns.onAgentEnd(messages);
		const data = { turn_id: turns.active?.turnId ?? null, messages: turns.userRunMessages(messages).map(summarizeMessage) };
		// A run that ends while castor is not up (an RPC abort while castor still starts; a castor
		// turn /castor restart stopped, its runtime stopping and the next one to start) is not held
		// until castor is up: Pi's abort, its settle and its quit wait for this handler -- after a
		// restart mid-turn the stopped run ended only once the new castor was up (5 s on a loaded
		// machine). Its end goes to castor once castor is up, before the run's settle, which takes
		// the same way (settled).
		if (startupPending || !runtime?.isUp) settleChain = settleChain.then(async () => void (await forward("agent_end", data)));
		else await forward("agent_end", data);
		if (!HAS_SETTLED) void emulateSettled(ctx, messages);
	});

	async function settled(aborted: boolean, ctx: Ctx): Promise<void> {
		let entryId: string | null = null;
		try {
			entryId = ctx?.sessionManager?.getLeafId?.() ?? null;
		} catch {
			entryId = null;
		}
		const turnId = turns.active?.turnId ?? null;
		runUnsettled = false;
		for (const wake of settleWaiters.splice(0)) wake();
		const outcome = turns.settle(sessionId, aborted, entryId);
		if (!outcome) turns.settleUserRun();
		if (outcome && !outcome.aborted && !outcome.error && !closingSession) castorTurnAnsweredAt = Date.now();
		// The user's run stopped only by the extension, at a withdrawn turn's prompt after their
		// answer, is not their abort: castor hears it settled (its memory capture is not skipped).
		const abortedForCastor = outcome ? aborted : turns.userRunAborted(aborted);
		// Turns castor asked for while this run went on wait in Pi's follow-up queue; aborted, the run
		// never reaches them. Stopped by the user (an Esc or an RPC abort during the run), they are
		// withdrawn (turns.ts withdrawFollowUps): castor is told they were interrupted. Stopped only by
		// castor (a crashed cast's actor restarted: its turn is sent again) or by the extension (at a
		// withdrawn turn's prompt), Pi keeps them queued for some later run: each is sent again now.
		const userStopped = lastStopKey.at >= runStartedAt;
		const stoppedByExtension = extensionStoppedRun;
		extensionStoppedRun = false;
		// A compaction the user asked for (`/compact`, an RPC `compact`) aborts the run first, and that
		// is no Esc either: the turns are sent once Pi's settle is over, held while Pi then compacts.
		if (aborted && !userStopped && !closingSession) {
			const piStoppedIt = !stoppedByExtension && compactionKeyAt < runStartedAt;
			const again = turns.redeliverFollowUps((turnId, sendNow) => void resendWhenPiIsFree(turnId, sendNow, piStoppedIt));
			if (again.length) log(`turns ${again.join(", ")} sent again: the run they waited behind was stopped by castor, the extension or a compaction, not the user`);
		}
		const withdrawn = aborted ? turns.withdrawFollowUps(sessionId, entryId) : [];
		if (withdrawn.length && stopNextTurnNotice) {
			// The Esc armed the stop for the turn a restarted cast sent again, and that turn waited
			// here: withdrawn, it is stopped. Left armed, the next castor turn (a /materia continue
			// typed at once) was stopped too.
			stopNextTurnUntil = 0;
			stopNextTurnNotice = "";
		}
		// A turn of a runtime that went away (orphanTurns) is reported to nobody: the runtime now up
		// (if any) never asked for it and would refuse its end.
		const outcomes = [...(outcome ? [outcome] : []), ...withdrawn].filter((o) => {
			if (!turns.wasOrphaned(o.turn_id)) return true;
			log(`turn ${o.turn_id} ended after its castor runtime went away: not reported`);
			return false;
		});
		// Reported in order, but outside Pi's agent_settled emission: Pi defers every prompt and
		// command (a /materia abort included) until the settle handlers return, so waiting here for
		// castor's answer would hold the user's next command for as long as castor takes.
		const epoch = sessionEpoch;
		const closed = () => closingSession || sessionEpoch !== epoch;
		settleChain = settleChain.then(async () => {
			if (outcomes.some((o) => o.aborted)) {
				// Pi quitting (or replacing the session) aborts the run first and then shuts the
				// session down: that turn was not ended by the user, the harness went away. Its end is
				// not reported; castor learns it from the session closing mid-turn (the cast stays
				// resumable). An Esc is reported (after the same short wait).
				await new Promise((resolve) => setTimeout(resolve, QUIT_GRACE_MS));
				if (closed()) {
					for (const o of outcomes) log(`turn ${o.turn_id} was aborted by Pi shutting the session down: not reported as its end`);
					return;
				}
			}
			for (const o of outcomes) await reportTurn(o as unknown as Params);
			if (!closed()) await forward("agent_settled", { aborted: abortedForCastor, turn_id: turnId });
		});
	}
	let settleChain: Promise<void> = Promise.resolve();
	/** When the last run started (agent_start): a stop key since then was the user's stop of it. */
	let runStartedAt = 0;

	/** A run started (agent_start) and has not settled yet. */
	let runUnsettled = false;
	/** Woken when the run settles (`endsReported` waits on one instead of polling). */
	const settleWaiters: Array<() => void> = [];
	/**
	 * Resolves once the last run has settled and its end has been reported to castor (see
	 * `settled`); Pi may say it is idle a moment before it emits the settle. Bounded by
	 * SETTLE_WAIT_MS, should a settle never come.
	 */
	async function endsReported(): Promise<void> {
		if (runUnsettled) {
			await new Promise<void>((resolve) => {
				const timer = setTimeout(wake, SETTLE_WAIT_MS);
				function wake(): void {
					clearTimeout(timer);
					const at = settleWaiters.indexOf(wake);
					if (at >= 0) settleWaiters.splice(at, 1);
					resolve();
				}
				settleWaiters.push(wake);
			});
		}
		let chain: Promise<void>;
		do {
			chain = settleChain;
			await chain.catch(() => undefined);
		} while (chain !== settleChain);
	}
	/** session_shutdown began (Pi quits or replaces the session); reset by the next session_start. */
	let closingSession = false;
	/** The user pressed Pi's quit keys while a hook waited for castor (EscWatch.quitting). */
	let quitting = false;
	/** Counts session shutdowns: work queued for one session is dropped once it has ended. */
	let sessionEpoch = 0;

	pi.on("agent_settled", async (event: any, ctx: Ctx) => {
		lastCtx = ctx;
		await settled(event?.aborted === true, ctx);
	});

	/** Pi 0.73 has no agent_settled: poll until idle after agent_end (outside the handler). */
	async function emulateSettled(ctx: Ctx, messages: unknown[]): Promise<void> {
		const deadline = Date.now() + 10 * 60 * 1000;
		while (Date.now() < deadline) {
			await new Promise((r) => setTimeout(r, 10));
			try {
				if (ctx.isIdle() && !ctx.hasPendingMessages?.()) break;
			} catch {
				return; // stale ctx: the session went away
			}
		}
		const last = [...messages].reverse().find((m: any) => m?.role === "assistant") as any;
		await settled(last?.stopReason === "aborted", ctx);
	}

	/** Pi compacts the session: from `session_before_compact` to its `session_compact` or `session_compact_failed`. */
	let compacting = false;
	/**
	 * Resolves once Pi is idle again after its compaction -- or a run of its own goes on once the
	 * compaction has ended (a turn then queues behind it as usual) -- or at once when the session
	 * ends. Pi's idleness is polled (Pi emits the compaction's end a moment before it clears its
	 * compacting state), so a compaction whose end event never comes holds no turn for longer.
	 */
	async function compactionEnded(): Promise<void> {
		while (!closingSession) {
			try {
				if (lastCtx?.isIdle?.() !== false) {
					compacting = false;
					return;
				}
			} catch {
				return; // a stale context: the session went away
			}
			if (!compacting && runUnsettled) return;
			await new Promise((resolve) => setTimeout(resolve, 20));
		}
	}
	/** Pi says it is not idle (a run, a compaction or a branch summary goes on). */
	function piBusy(): boolean {
		try {
			return lastCtx?.isIdle?.() === false;
		} catch {
			return false; // a stale context
		}
	}
	/** What Pi does now (compactionBegins). */
	function piActivity(): PiActivity {
		if (closingSession) return "gone";
		if (compacting) return "compacting";
		if (runUnsettled) return "run";
		try {
			return lastCtx?.isIdle?.() === false ? "compacting" : "idle";
		} catch {
			return "gone"; // a stale context
		}
	}
	/**
	 * A prompt Pi began to send with no run going on (its `input` event; the one the user typed during
	 * a compaction, which Pi sends at its end) until its run begins (`before_agent_start`): Pi is idle
	 * meanwhile, and a castor turn sent then started its own run first -- and Pi steered the user's
	 * prompt into it, where it took the turn over. A turn waits for that run's start (then it queues
	 * behind it), within PROMPT_START_WAIT_MS: a prompt handled or refused starts no run.
	 */
	let promptStartingUntil = 0;
	pi.on("input", (event: any) => {
		if (event?.streamingBehavior === undefined && !runUnsettled) promptStartingUntil = Date.now() + PROMPT_START_WAIT_MS;
		return undefined; // the text goes on as typed
	});
	async function promptStarted(turnId: string): Promise<void> {
		while (promptStartingUntil && !closingSession) {
			if (Date.now() >= promptStartingUntil) {
				promptStartingUntil = 0;
				log(`turn ${turnId}: the prompt Pi began to send started no run within ${PROMPT_START_WAIT_MS} ms: the turn is sent now`);
				return;
			}
			await new Promise((resolve) => setTimeout(resolve, 20));
		}
	}
	/** Pi compacts (or summarizes a branch) with no run going on: it is not idle, and no run is. */
	function piCompacting(): boolean {
		if (compacting) return true;
		try {
			return !runUnsettled && lastCtx?.isIdle?.() === false;
		} catch {
			return false; // a stale context
		}
	}
	/**
	 * Sends a turn that waited behind a run stopped by castor, the extension or a compaction (see
	 * `settled`) once Pi's settle of that run is over. The user's `/compact` (an RPC `compact`) aborts
	 * the run going on and waits for Pi to be idle before it compacts: the turn, sent again as the
	 * run settled, started then -- before the compaction, which waited for the whole turn or ran
	 * beside it, the turn's request with the context before it. Now, when Pi goes on to compact, the
	 * turn waits for the compaction's end, as a turn castor asks for during one does. A turn castor
	 * stopped meanwhile, or a session ending, is not sent.
	 */
	async function resendWhenPiIsFree(turnId: string, sendNow: (busy: boolean) => void, piStoppedIt: boolean): Promise<void> {
		const epoch = sessionEpoch;
		// Pi says nothing of a compaction to come; its state shows one once it has begun (not idle, no
		// run). A run Pi stopped itself -- no key, neither castor nor the extension -- is the user's
		// compaction's: its start is waited for, within a bound (reported when it passes). A run castor
		// or the extension stopped expects none: Pi's state is read once, after Pi's settle.
		const begun = await compactionBegins(piActivity, piStoppedIt ? COMPACTION_START_WAIT_MS : 0);
		if (begun === "timeout") {
			log(`turn ${turnId}: Pi stopped the run it waited behind and began no compaction within ` +
				`${COMPACTION_START_WAIT_MS} ms: it is sent again now`);
		}
		if (begun === "compacting") {
			log(`turn ${turnId} held until Pi's compaction ends`);
			await compactionEnded();
		}
		await promptStarted(turnId);
		if (closingSession || sessionEpoch !== epoch) {
			log(`turn ${turnId} not started: the session is ending`);
			return;
		}
		if (!turns.isWaiting(turnId)) return; // castor stopped it meanwhile
		// A run goes on now (the prompt the user typed during the compaction, which Pi sends at its end):
		// the turn waits behind it as a follow-up and runs once it ends, as its own turn.
		const busy = runUnsettled || piBusy();
		if (busy) log(`turn ${turnId} queued as a follow-up (Pi is busy)`);
		sendNow(busy);
	}
	pi.on("session_before_compact", (_event: any, ctx: Ctx) => {
		lastCtx = ctx;
		compacting = true;
		return undefined; // never cancels nor replaces Pi's compaction
	});
	pi.on("session_compact", () => {
		compacting = false;
	});
	pi.on("session_compact_failed", () => {
		compacting = false;
	});

	pi.on("session_shutdown", async (event: any, ctx: Ctx) => {
		lastCtx = ctx;
		closingSession = true;
		compacting = false;
		promptStartingUntil = 0;
		stopKeys?.dispose();
		stopKeys = undefined;
		stopPromptHeldAtStart = false;
		sessionEpoch++;
		const rt = runtime;
		try {
			// Asked first, always (one round trip): a stopped castor costs quitting the probe, not a deadline.
			if (rt?.isUp && (await rt.probe(probeMs()))) {
				await forward("session_shutdown", { reason: event?.reason ?? null });
				// Not after a shutdown event castor let pass its deadline: quitting costs one deadline at most.
				if (rt.has("session.close") && !rt.silent) await rt.call("session.close", { session_id: sessionId }, { spawn: false });
			}
		} catch (err) {
			log(`session.close failed: ${errorText(err)}`);
		} finally {
			openedGeneration = -1;
			setStatus(STATUS_KEY, undefined);
			// Whatever the reason: Pi (1.x) loads the extension afresh for the session that replaces
			// this one (/new, /resume, /fork, /reload), and that instance starts its own castor. Left
			// running, this one stayed behind with its workers until Pi quit, one more per switch.
			// Stopped here, before the next session starts, so nothing of the old runtime (a cast's
			// lease) is still held when the new one looks for the project's casts. A Pi that keeps
			// this instance starts the runtime again at the next session_start.
			if (rt) {
				await rt.stop();
				stoppedAtShutdown = true;
			}
		}
	});
}
