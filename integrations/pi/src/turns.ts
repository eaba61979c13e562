/**
 * Agent turns castor asks for (`agent.run_turn`) and their outcome (`agent.turn_ended`).
 *
 * A turn is a hidden custom message (display:false) that triggers a Pi run. The run is
 * bound to the turn by the message's `details.castor_turn_id` in `before_agent_start`
 * (Pi 1.x), or — for Pi 0.73, which skips that event for custom runs — by the first
 * `agent_start` after dispatch. Every `agent_end` of the bound run adds its assistant
 * usage; the latest assistant message gives text, stop reason and error. At settlement
 * the outcome is reported once and the tool scope that the turn changed is restored.
 *
 * A message the user types while the turn runs (Pi's steer or follow-up) is answered inside the
 * same run. Nothing from that message on belongs to the turn: its answer is the last assistant
 * message before it when that one was final, and when the user's message came before the turn
 * had answered (a steer between tool calls), the turn was taken over — it is reported as
 * interrupted (`aborted`), so castor keeps none of it and `/materia continue` runs it again.
 *
 * A user-driven refinement turn (castor's `turn_settings` answer to `before_agent_start`) gets the
 * same model/thinking/tool application; its tool scope is restored when the user's run settles.
 *
 * castor may abort a turn (`agent.abort_turn`, see {@link TurnTracker.abort}): the running turn is
 * marked so the caller aborts Pi's run (its outcome still goes out, `aborted: true`); a queued or
 * not yet dispatched one is dropped and never started; a run that still starts from its hidden
 * message is recognised ({@link TurnTracker.isAbortedMessage}) and aborted before its first request.
 *
 * A turn sent while Pi was busy waits in Pi's follow-up queue. When the run it waits behind is
 * aborted, Pi never reaches it (its Esc drops the queue; an RPC abort keeps it for a later run):
 * it is withdrawn ({@link TurnTracker.withdrawFollowUps}) and reported interrupted, and a later
 * delivery of its prompt stops that run there.
 *
 * Guarantees: each dispatched turn yields exactly one outcome (success, error, interrupted, or a
 * dispatch failure reported immediately) unless castor aborted it before it ran; a user
 * run never reports a castor turn.
 */
import { addUsage, answerFields, emptyUsage, flattenText, type WireUsage } from "./messages.ts";

export const TURN_MESSAGE_TYPE = "castor-turn";

export interface RunTurnParams {
	session_id?: string;
	turn_id: string;
	prompt: string;
	summary?: string | null;
	custom_type?: string | null;
	model?: { provider: string | null; id: string } | null;
	thinking?: string | null;
	tools?: string[] | null;
	isolate?: boolean | null;
	/** pi-materia's `details` of the visible summary's message (socket, materia, ordinal, item, model record). */
	summary_details?: Record<string, unknown> | null;
	/** pi-materia's `details` of the hidden prompt's message (phase, socket, materia, item, model record). */
	prompt_details?: Record<string, unknown> | null;
}

/** A plain object from the wire, or undefined (an array or a scalar is not a `details` record). */
function record(value: unknown): Record<string, unknown> | undefined {
	return value && typeof value === "object" && !Array.isArray(value) ? (value as Record<string, unknown>) : undefined;
}

/** A turn's model / thinking / tool scope, as castor encodes them (`agent.run_turn`, `turn_settings`). */
export interface TurnSettings {
	model?: { provider: string | null; id: string } | null;
	thinking?: string | null;
	tools?: string[] | null;
}

/** What applying settings needs from Pi's extension context. */
export interface SettingsCtx {
	modelRegistry?: ModelLookup;
	/** Pi's active model (`ctx.model`): named when a materia model falls back to it. */
	model?: unknown;
}

/** The part of Pi's model registry that resolves a materia's model. */
export interface ModelLookup {
	find?(provider: string, id: string): unknown;
	getAll?(): unknown[];
}

/**
 * The registry's model for `provider/id`, or for a bare `id` the one model of that id; else why
 * not: `unknown_model`, `ambiguous_model` (a bare id several providers serve), or
 * `model_registry_unavailable`.
 */
export function resolveModel(registry: ModelLookup | undefined, provider: string | null | undefined, id: string): { model: unknown } | string {
	if (provider) {
		if (typeof registry?.find !== "function") return "model_registry_unavailable";
		const model = registry.find(provider, id);
		return model ? { model } : "unknown_model";
	}
	if (typeof registry?.getAll !== "function") return "model_registry_unavailable";
	const matches = registry.getAll().filter((m) => (m as { id?: unknown })?.id === id);
	if (matches.length === 1) return { model: matches[0] };
	return matches.length === 0 ? "unknown_model" : "ambiguous_model";
}

export interface TurnOutcome {
	session_id: string;
	turn_id: string;
	text: string;
	stop_reason: string | null;
	error: string | null;
	/** null: unknown -- the turn was stopped before the provider reported any usage (see {@link countsNoTokens}). */
	usage: WireUsage | null;
	/** Every assistant message's usage map as the provider wrote it (castor reads each with all of pi-materia's aliases). */
	usages: unknown[];
	/**
	 * true: the turn's stopped message reported nothing of its own (see {@link countsNoTokens}) while
	 * earlier messages (tool-call steps) did: `usage`/`usages` are theirs, and castor marks the turn's
	 * usage as not all reported. Absent otherwise (with nothing else reported, `usage` is null).
	 */
	stopped_usage_unknown?: true;
	/** The answering message's model `{provider, id, api}` and thinking level, when Pi names them. */
	model?: unknown;
	thinking_level?: unknown;
	aborted: boolean;
	entry_id: string | null;
}

/** How many aborted turn ids are remembered (late frames for older ones are simply unknown). */
const ABORTED_MEMORY = 256;

/** Where an aborted turn was: running now, waiting in the queue, or not (any more) known. */
export type AbortFound = "active" | "queued" | "unknown";

interface Turn {
	turnId: string;
	/** Bound inside a run that was already going on (a follow-up): only what follows its prompt counts. */
	inRun?: boolean;
	/** castor asked to abort this turn while it ran. */
	abortRequested?: boolean;
	/**
	 * A message the user sent while the turn ran (Pi's steer or follow-up) was answered in the same
	 * run: what follows it is the user's exchange, never this turn's. `true` when it came before the
	 * turn's final answer (the turn was taken over: reported as interrupted), `"after"` when the
	 * turn had answered already (that answer stands).
	 */
	interjected?: true | "after";
	/**
	 * The hidden prompt of a withdrawn turn (see {@link TurnTracker.withdrawFollowUps}) reached this
	 * run after the turn answered, and the run was stopped there: the abort is not the turn's.
	 */
	cutByStale?: boolean;
	/** Sent while Pi was busy: its hidden prompt waits in Pi's follow-up queue for the run going on. */
	followUp?: boolean;
	/** The hidden prompt as sent (sent again by {@link TurnTracker.redeliverFollowUps}). */
	message?: { customType: string; content: string; display: boolean; details: Record<string, unknown> };
	/**
	 * Sent again after a run the extension or castor stopped (not the user), while Pi still holds the
	 * first copy in its follow-up queue: that copy, when Pi delivers it, is stopped there.
	 */
	heldCopy?: boolean;
	/** Its hidden prompt went into a run that was stopped before the turn's first request: Pi holds no copy. */
	noHeldCopy?: boolean;
	customType: string;
	isolate: boolean;
	restoreTools?: string[];
	usage: WireUsage;
	usages: unknown[];
	/** A message of the turn was stopped mid-stream before its provider reported usage (its zeros are not counted). */
	usageUnknown?: boolean;
	/**
	 * The extension stopped the turn's run at its start, before its first model request
	 * ({@link TurnTracker.stoppedBeforeRequest}): the aborted message Pi records then was never sent,
	 * so the turn used nothing -- its zeros are its usage, not an unknown.
	 */
	notRequested?: boolean;
	last?: Record<string, unknown>;
}

/** The subset of Pi's ExtensionAPI this module uses. */
export interface TurnHost {
	sendMessage(message: { customType: string; content: string; display: boolean; details?: unknown }, options?: { triggerTurn?: boolean; deliverAs?: "steer" | "followUp" | "nextTurn" }): void;
	getActiveTools(): string[];
	setActiveTools(names: string[]): void;
	setModel(model: unknown): Promise<boolean>;
	setThinkingLevel(level: never): void;
	/** The level Pi runs at (it clamps a level the model does not support): read back after setting one. */
	getThinkingLevel?(): string;
}

/** `provider/id` of a Pi model object (`ctx.model`), else the empty string. */
export function modelLabel(model: unknown): string {
	if (model === null || typeof model !== "object") return "";
	const { provider, id } = model as { provider?: unknown; id?: unknown };
	if (typeof id !== "string" || !id) return "";
	return typeof provider === "string" && provider ? `${provider}/${id}` : id;
}

/** The `model` and `thinking_level` fields of an answer, for the turn's outcome. */
function modelOf(message: Record<string, unknown>): Record<string, unknown> {
	const { model, thinking_level } = answerFields(message);
	return { ...(model ? { model } : {}), ...(thinking_level ? { thinking_level } : {}) };
}

/** An assistant message that ends its answer (not one that asks for tools and goes on). */
function isFinalAnswer(message: Record<string, unknown>): boolean {
	return message.stopReason !== "toolUse";
}

export class TurnTracker {
	private readonly queued: Turn[] = [];
	private current: Turn | undefined;
	private userRestoreTools: string[] | undefined;
	private readonly abortedIds = new Set<string>();
	/** Turns of a runtime that went away while they ran or waited ({@link orphan}): never reported. */
	private readonly orphanedIds = new Set<string>();
	/** Turns whose `agent.run_turn` is being applied ({@link dispatch}), not queued yet. */
	private readonly dispatching = new Set<string>();
	/**
	 * The user's run (no castor turn bound) was stopped where Pi delivered the prompt of a turn
	 * castor had withdrawn (see {@link bindFromContext}): that prompt's turn id, until the run
	 * settles. The stop is the extension's, not the user's: their exchange ended before it.
	 */
	private staleCut: string | undefined;
	/** The user's run cut at {@link staleCut} had ended with a final answer before the cut. */
	private staleCutAnswered = false;
	private readonly pi: TurnHost;

	private readonly warn: (text: string) => void;

	/** `warn` tells the user of a setting that could not be applied (a model Pi cannot use). */
	constructor(pi: TurnHost, warn: (text: string) => void = () => {}) {
		this.pi = pi;
		this.warn = warn;
	}

	get active(): Turn | undefined {
		return this.current;
	}

	/**
	 * Apply model/thinking/tool scope and send the hidden prompt. Throws (after undoing the
	 * tool scope) when Pi refuses the message; the caller reports that as the turn's error.
	 */
	async dispatch(params: RunTurnParams, ctx: SettingsCtx & { isIdle(): boolean }): Promise<void> {
		const turn: Turn = {
			turnId: String(params.turn_id),
			customType: params.custom_type || TURN_MESSAGE_TYPE,
			isolate: params.isolate === true,
			usage: emptyUsage(),
			usages: [],
		};
		if (this.abortedIds.has(turn.turnId)) return; // castor withdrew it before it was sent
		this.dispatching.add(turn.turnId);
		try {
			turn.restoreTools = await this.applySettings(params, ctx);
		} finally {
			this.dispatching.delete(turn.turnId);
		}
		if (this.abortedIds.has(turn.turnId)) {
			this.restore(turn); // aborted (or its runtime gone) while the settings were applied
			return;
		}
		if (params.summary) {
			const details = record(params.summary_details);
			this.pi.sendMessage({ customType: "pi-materia", content: params.summary, display: true, ...(details ? { details } : {}) }, { triggerTurn: false });
		}
		this.queued.push(turn);
		try {
			const message = { customType: turn.customType, content: params.prompt, display: false, details: { ...record(params.prompt_details), castor_turn_id: turn.turnId } };
			turn.message = message;
			turn.followUp = !ctx.isIdle();
			this.pi.sendMessage(message, turn.followUp ? { triggerTurn: true, deliverAs: "followUp" } : { triggerTurn: true });
		} catch (err) {
			this.queued.splice(this.queued.indexOf(turn), 1);
			this.restore(turn);
			throw err;
		}
	}

	/**
	 * castor aborted turn `turnId` (`agent.abort_turn`). The running turn is marked (the caller
	 * aborts Pi's run; its outcome is still reported, `aborted: true`); a queued one is dropped
	 * (its hidden message, if Pi already holds it, is aborted when its run starts). The id is
	 * remembered either way, so a later `agent.run_turn` for it is not started and a refused late
	 * `agent.turn_ended` is not an error. Idempotent: a second abort finds the turn `unknown`.
	 */
	abort(turnId: string): AbortFound {
		this.remember(turnId);
		if (this.current?.turnId === turnId) {
			if (this.current.abortRequested) return "unknown";
			this.current.abortRequested = true;
			return "active";
		}
		const index = this.queued.findIndex((t) => t.turnId === turnId);
		if (index >= 0) {
			const [turn] = this.queued.splice(index, 1);
			if (turn) this.restore(turn);
			return "queued";
		}
		return "unknown";
	}

	/**
	 * The run these turns were queued behind (as follow-ups) settled aborted before Pi reached them:
	 * Pi's Esc drops its queue with the run, and an RPC abort leaves them there until some later run
	 * -- either way they did not run now, and castor would wait for them for ever. Each is taken
	 * out and returned as an interrupted outcome (castor keeps none of it; `/materia continue` runs
	 * it again), remembered as aborted so a late delivery of its prompt is stopped
	 * ({@link bindFromContext} answers "aborted"), and its tool scope undone.
	 */
	withdrawFollowUps(sessionId: string, entryId: string | null): TurnOutcome[] {
		const stranded = this.queued.filter((t) => t.followUp);
		if (stranded.length === 0) return [];
		for (const turn of stranded) this.queued.splice(this.queued.indexOf(turn), 1);
		// Undone newest first: the oldest restore puts back what was active before any of them.
		for (const turn of [...stranded].reverse()) this.restore(turn);
		return stranded.map((turn) => {
			this.remember(turn.turnId);
			return {
				session_id: sessionId,
				turn_id: turn.turnId,
				text: "",
				stop_reason: "aborted",
				error: "the run this turn was queued behind was stopped before the turn started",
				usage: emptyUsage(),
				usages: [],
				aborted: true,
				entry_id: entryId,
			};
		});
	}

	/**
	 * The run these turns were queued behind (as follow-ups) was stopped by castor (it aborted the
	 * turn bound to it, as when it restarts a crashed cast's actor) or by the extension (at a withdrawn
	 * turn's prompt), not by the user: Pi keeps its follow-up queue through such an abort and delivers
	 * it only with some later run, so the turns would wait for the user's next prompt -- and were
	 * reported interrupted, although nobody stopped them (a re-sent turn never ran). Each is sent
	 * again to start a run of its own now; the copy Pi still holds is stopped where Pi delivers it.
	 * `send`, when given, is handed each turn's sending to do when it chooses (the caller holds it
	 * while Pi compacts), and says then whether a run of Pi's goes on (`busy`): the turn is queued
	 * behind it as a follow-up, as one castor asks for then -- sent plainly, Pi took it as a steer
	 * message into that run (the user's prompt Pi sent at its compaction's end), after a tool call,
	 * before the user's answer. Returns the ids sent again.
	 */
	redeliverFollowUps(send?: (turnId: string, sendNow: (busy: boolean) => void) => void): string[] {
		const waiting = this.queued.filter((t) => t.followUp && t.message);
		for (const turn of waiting) {
			turn.followUp = false;
			turn.heldCopy = !turn.noHeldCopy;
			turn.noHeldCopy = false;
			const sendNow = (busy: boolean) => {
				turn.followUp = busy;
				this.pi.sendMessage(turn.message!, busy ? { triggerTurn: true, deliverAs: "followUp" } : { triggerTurn: true });
			};
			if (send) send(turn.turnId, sendNow);
			else sendNow(false);
		}
		return waiting.map((t) => t.turnId);
	}

	/**
	 * The bound turn's run was stopped before the turn's first request by a key that went to Pi's
	 * compaction (Pi's RPC abort stops the run too, its terminal's Esc only the compaction): the turn
	 * waits again, first in line, as a follow-up of that run whose prompt Pi no longer holds -- sent
	 * again when the run settles ({@link redeliverFollowUps}). Returns its id.
	 */
	requeueUnrequested(): string | undefined {
		const turn = this.current;
		if (!turn) return undefined;
		this.current = undefined;
		turn.inRun = false;
		turn.followUp = true;
		turn.heldCopy = false;
		turn.noHeldCopy = true;
		this.queued.unshift(turn);
		return turn.turnId;
	}

	/** Whether `turnId` still waits here to start (queued, neither started, dropped nor withdrawn). */
	isWaiting(turnId: string): boolean {
		return this.queued.some((t) => t.turnId === turnId);
	}

	/**
	 * The runtime that asked for the turns known here went away (it died, its connection was lost, or
	 * the user restarted it): nothing can take their ends any more -- the runtime the next command
	 * starts knows none of them (it refuses such an end: "no pending turn"), and the cast resumes from
	 * its saved state (`/materia recast` runs the turn again). The running turn is marked (the caller
	 * aborts Pi's run: the model would stream an answer nobody reads, and be paid for it); turns
	 * waiting in the queue or being applied are dropped (tool scope undone). All are remembered as
	 * aborted, so a hidden prompt Pi still holds is stopped when it is delivered, and as orphaned, so
	 * {@link wasOrphaned} tells the caller to report none of them. Returns the running turn's id and
	 * the dropped ones'.
	 */
	orphan(): { active: string | undefined; dropped: string[] } {
		const waiting = this.queued.splice(0);
		for (const turn of [...waiting].reverse()) this.restore(turn); // newest first, as withdrawFollowUps
		const dropped = [...waiting.map((t) => t.turnId), ...this.dispatching];
		const active = this.current?.turnId;
		for (const id of [...dropped, ...(active !== undefined ? [active] : [])]) {
			this.remember(id);
			this.orphanedIds.add(id);
			while (this.orphanedIds.size > ABORTED_MEMORY) {
				const oldest = this.orphanedIds.values().next().value;
				if (oldest === undefined) break;
				this.orphanedIds.delete(oldest);
			}
		}
		if (this.current) this.current.abortRequested = true;
		return { active, dropped };
	}

	/** Whether turn `turnId` belonged to a runtime that went away ({@link orphan}): its end is not reported. */
	wasOrphaned(turnId: string): boolean {
		return this.orphanedIds.has(turnId);
	}

	/** Whether turn `turnId` waits in Pi's follow-up queue (sent while Pi was busy, not bound yet). */
	isQueuedFollowUp(turnId: string): boolean {
		return this.queued.some((t) => t.turnId === turnId && t.followUp === true);
	}

	/** Whether castor aborted `turnId` (remembered for the last {@link ABORTED_MEMORY} aborts). */
	wasAborted(turnId: string): boolean {
		return this.abortedIds.has(turnId);
	}

	/** Whether a run's starting custom message is the hidden prompt of an aborted turn. */
	isAbortedMessage(message: unknown): boolean {
		const id = (message as { details?: { castor_turn_id?: unknown } } | undefined)?.details?.castor_turn_id;
		return typeof id === "string" && this.abortedIds.has(id) && this.current?.turnId !== id;
	}

	private remember(turnId: string): void {
		this.abortedIds.delete(turnId);
		this.abortedIds.add(turnId);
		while (this.abortedIds.size > ABORTED_MEMORY) {
			const oldest = this.abortedIds.values().next().value;
			if (oldest === undefined) break;
			this.abortedIds.delete(oldest);
		}
	}

	/** Pi 1.x: bind by the custom message that started the run. */
	/**
	 * The bound turn's run is being stopped at its start, before its first model request (an Esc
	 * meant for it landed as castor sent it): it used no tokens, and is reported so -- not as a turn
	 * whose usage went unreported.
	 */
	stoppedBeforeRequest(): void {
		if (this.current) this.current.notRequested = true;
	}

	bindFromMessage(message: unknown): boolean {
		const details = (message as { details?: { castor_turn_id?: unknown } } | undefined)?.details;
		const id = details?.castor_turn_id;
		if (typeof id !== "string") return false;
		const index = this.queued.findIndex((t) => t.turnId === id);
		if (index < 0) return false;
		this.current = this.queued.splice(index, 1)[0];
		return true;
	}

	/**
	 * Pi 1.x delivers a turn sent as a follow-up (castor asked while Pi was busy) inside the run that
	 * was going on, without a `before_agent_start`: bind it when its hidden prompt shows up after the
	 * last assistant message of that run's context. `aborted`: that prompt is of a turn castor aborted
	 * (the caller aborts the run). Nothing happens while a turn is bound.
	 */
	bindFromContext(messages: unknown[]): "bound" | "aborted" | undefined {
		if (this.current) {
			// Pi held the prompt of a turn withdrawn at an abort (an RPC abort leaves its queue) and
			// delivers it now, after this turn's answer: the run is stopped there, the answer stands.
			for (let i = messages.length - 1; i >= 0; i--) {
				const m = messages[i] as { role?: unknown; details?: { castor_turn_id?: unknown } } | undefined;
				if (m?.role === "assistant") return undefined;
				const id = m?.details?.castor_turn_id;
				if (typeof id === "string" && id !== this.current.turnId && this.abortedIds.has(id)) {
					this.current.cutByStale = true;
					return "aborted";
				}
				if (id === this.current.turnId && this.current.heldCopy && ownPrompts(messages, id) > 1) {
					// The first copy of a turn sent again, which Pi held in its follow-up queue: the
					// turn has run already (its answer is above); stopped there, the answer stands.
					this.current.heldCopy = false;
					this.current.cutByStale = true;
					return "aborted";
				}
			}
			return undefined;
		}
		for (let i = messages.length - 1; i >= 0; i--) {
			const m = messages[i] as { role?: unknown; details?: { castor_turn_id?: unknown } } | undefined;
			if (m?.role === "assistant") return undefined;
			const id = m?.details?.castor_turn_id;
			if (typeof id !== "string") continue;
			if (this.abortedIds.has(id)) {
				this.staleCut = id;
				return "aborted";
			}
			const index = this.queued.findIndex((t) => t.turnId === id);
			if (index < 0) return undefined;
			const [turn] = this.queued.splice(index, 1);
			if (!turn) return undefined;
			turn.inRun = true;
			this.current = turn;
			return "bound";
		}
		return undefined;
	}

	/**
	 * The messages of the user's run as castor should hear them at its end: cut before the prompt of
	 * a withdrawn turn that stopped the run ({@link staleCut}), so what castor takes as the run's
	 * answer (a memory capture's) is the user's answer, not the stop's empty aborted message.
	 * Unchanged otherwise.
	 */
	userRunMessages(messages: unknown[]): unknown[] {
		if (this.current || this.staleCut === undefined) return messages;
		const cut = messages.findIndex((m) => (m as { details?: { castor_turn_id?: unknown } } | undefined)?.details?.castor_turn_id === this.staleCut);
		if (cut < 0) return messages;
		const kept = messages.slice(0, cut);
		const last = [...kept].reverse().find((m) => (m as { role?: unknown } | undefined)?.role === "assistant") as Record<string, unknown> | undefined;
		this.staleCutAnswered = last !== undefined && isFinalAnswer(last) && last.stopReason !== "aborted" && last.stopReason !== "error";
		return kept;
	}

	/**
	 * Whether the user's run that settled `aborted` is reported to castor as aborted: not when the
	 * only stop was the extension's, at a withdrawn turn's prompt, after the user's final answer.
	 * Ends that run's cut (call once per settle of a run with no castor turn bound).
	 */
	userRunAborted(aborted: boolean): boolean {
		const answered = this.staleCut !== undefined && this.staleCutAnswered;
		this.staleCut = undefined;
		this.staleCutAnswered = false;
		return aborted && !answered;
	}

	/**
	 * Pi 0.73 fallback: a run that starts while a turn is queued and none is bound is that turn.
	 * `sawBeforeStart`: the run had its `before_agent_start` (every run of Pi 1.x; a user's prompt's
	 * on 0.73), which binds a castor turn by its prompt -- a run it did not bind is not a castor turn's.
	 * On Pi 1.x the user's prompt Pi sent at its compaction's end, with a turn held for that end
	 * waiting here, was bound as that turn: its answer was taken as the turn's, and the turn was stopped.
	 */
	bindOnAgentStart(sawBeforeStart = false): void {
		this.staleCut = undefined;
		this.staleCutAnswered = false;
		if (sawBeforeStart) return;
		if (!this.current && this.queued.length > 0) this.current = this.queued.shift();
	}

	onAgentEnd(messages: unknown[]): void {
		const turn = this.current;
		if (!turn) return;
		let from = 0;
		if (turn.inRun) {
			// The run began as something else (the user's prompt): its earlier answers are not this turn's.
			const start = messages.findIndex((m) => (m as { details?: { castor_turn_id?: unknown } })?.details?.castor_turn_id === turn.turnId);
			if (start >= 0) from = start + 1;
		}
		if (turn.interjected) return; // the rest of the run is the user's exchange
		const promptAt = promptTimestamp(messages, turn.turnId);
		let ownSeen = from > 0;
		for (const m of messages.slice(from)) {
			const msg = m as Record<string, unknown>;
			const id = (msg?.details as { castor_turn_id?: unknown } | undefined)?.castor_turn_id;
			if (typeof id === "string" && id !== turn.turnId && this.abortedIds.has(id)) return; // a withdrawn turn's prompt: not this turn's
			if (id === turn.turnId) {
				if (ownSeen) return; // the copy Pi held of a turn sent again: what follows is not this turn's
				ownSeen = true;
			}
			if (msg?.role === "user") {
				if (queuedBefore(msg, promptAt)) continue; // left queued by an abort: not typed during this turn
				// The user typed while the turn ran and Pi answered them in this run: the turn's
				// answer is the last one before their message, if it was a final one.
				turn.interjected = turn.last && isFinalAnswer(turn.last) ? "after" : true;
				return;
			}
			if (msg?.role !== "assistant") continue;
			turn.last = msg;
			if (msg.stopReason === "aborted" && countsNoTokens(msg.usage) && !turn.notRequested) {
				// Stopped before the provider said what it used (an OpenAI-style stream reports usage
				// at its end; Pi's message still holds its zeros): unknown, not nothing.
				turn.usageUnknown = true;
				continue;
			}
			turn.usage = addUsage(turn.usage, msg.usage);
			const answer = answerFields(msg);
			if (answer.usage !== undefined) turn.usages.push(answer.usage);
		}
	}

	/**
	 * The bound turn's context with the user's messages Pi queued before the turn's hidden prompt
	 * moved in front of it: Pi keeps a steer queued through an RPC `abort` (its terminal UI's Esc puts
	 * it back in the editor instead) and delivers it at the start of the next run, right after that
	 * run's prompt. When that run is castor's turn, the model would answer the stale message with the
	 * turn's prompt; in front of it, the turn's prompt is the last thing the model is asked (and an
	 * isolated turn, which starts at its prompt, leaves it out). `undefined` when nothing moved.
	 */
	leftoversFirst(messages: unknown[]): unknown[] | undefined {
		const turn = this.current;
		if (!turn || turn.inRun) return undefined;
		const at = messages.findIndex((m) => (m as { details?: { castor_turn_id?: unknown } } | undefined)?.details?.castor_turn_id === turn.turnId);
		if (at < 0) return undefined;
		const promptAt = promptTimestamp(messages, turn.turnId);
		const after = messages.slice(at + 1);
		const leftovers = after.filter((m) => (m as { role?: unknown } | undefined)?.role === "user" && queuedBefore(m as Record<string, unknown>, promptAt));
		if (leftovers.length === 0) return undefined;
		return [...messages.slice(0, at), ...leftovers, messages[at], ...after.filter((m) => !leftovers.includes(m))];
	}

	/** Messages Pi should send for an isolated turn: from its hidden prompt on. */
	isolate(messages: unknown[]): unknown[] | undefined {
		const turn = this.current;
		if (!turn?.isolate) return undefined;
		for (let i = messages.length - 1; i >= 0; i--) {
			const details = (messages[i] as { details?: { castor_turn_id?: unknown } }).details;
			if (details?.castor_turn_id === turn.turnId) return messages.slice(i);
		}
		return undefined;
	}

	/** Finish the bound turn (if any) and return its outcome. */
	settle(sessionId: string, aborted: boolean, entryId: string | null): TurnOutcome | undefined {
		const turn = this.current;
		if (!turn) return undefined;
		this.current = undefined;
		this.restore(turn);
		// Pi still holds the first copy of this turn, sent again (redeliverFollowUps): stopped when delivered.
		if (turn.heldCopy) this.remember(turn.turnId);
		const last = turn.last;
		const stopReason = typeof last?.stopReason === "string" ? last.stopReason : null;
		let error: string | null = null;
		if (turn.interjected === true) error = "a message the user sent during the turn took it over before it answered";
		else if (!last) error = "Pi agent turn ended without an assistant response";
		else if (stopReason === "error") error = typeof last.errorMessage === "string" ? last.errorMessage : "unknown agent error";
		return {
			session_id: sessionId,
			turn_id: turn.turnId,
			text: last ? flattenText(last.content).trim() : "",
			stop_reason: stopReason,
			error,
			// Only stopped zeros: castor records the turn as reporting no usage, never as free.
			usage: turn.usageUnknown && turn.usages.length === 0 ? null : turn.usage,
			usages: turn.usages,
			...(turn.usageUnknown && turn.usages.length > 0 ? { stopped_usage_unknown: true as const } : {}),
			...(last ? modelOf(last) : {}),
			// A run stopped at a withdrawn turn's prompt after this turn's final answer: that abort is not this turn's.
			aborted: (aborted && !(turn.cutByStale && last && isFinalAnswer(last))) || stopReason === "aborted" ||
				turn.abortRequested === true || turn.interjected === true,
			entry_id: entryId,
		};
	}

	/**
	 * A user-driven refinement turn (castor's answer to `before_agent_start`): apply the materia's
	 * model, thinking and tool scope to the run the user's message starts; the tool scope is put
	 * back by {@link settleUserRun}. Never throws: an unknown model is skipped and reported, the
	 * user's run goes on.
	 */
	async applyUserTurn(settings: TurnSettings, ctx: SettingsCtx, warn: (text: string) => void): Promise<void> {
		try {
			const restore = await this.applySettings(settings, ctx);
			if (restore && !this.userRestoreTools) this.userRestoreTools = restore;
		} catch (err) {
			warn(err instanceof Error ? err.message : String(err));
		}
	}

	/** The user's run settled: restore the tool scope a refinement turn changed (no-op otherwise). */
	settleUserRun(): void {
		const tools = this.userRestoreTools;
		this.userRestoreTools = undefined;
		if (tools) this.pi.setActiveTools(tools);
	}

	/**
	 * Model first, then thinking, then the tool scope; returns the tools to restore. A model Pi
	 * cannot use falls back to the active one, as pi-materia does: the turn runs and {@link warn}
	 * says why (`unknown_model`, `ambiguous_model`, `credentials_missing`,
	 * `model_registry_unavailable`). Only a Pi that cannot set a model at all throws.
	 */
	private async applySettings(settings: TurnSettings, ctx: SettingsCtx): Promise<string[] | undefined> {
		const wanted = settings.model;
		if (wanted?.id) {
			const label = wanted.provider ? `${wanted.provider}/${wanted.id}` : wanted.id;
			if (typeof this.pi.setModel !== "function") throw new Error(`the materia model setting is unsupported: this Pi cannot set a model (${label})`);
			const found = resolveModel(ctx?.modelRegistry, wanted.provider, wanted.id);
			let reason = typeof found === "string" ? found : undefined;
			if (typeof found !== "string" && !(await this.pi.setModel(found.model))) reason = "credentials_missing";
			if (reason) {
				const why = reason === "credentials_missing" ? `configured model "${label}" has no configured API key or credentials` : `configured model "${label}" is unavailable`;
				const active = modelLabel(ctx?.model);
				this.warn(`materia model "${label}" is not used (${reason}); the turn runs on the active Pi model: ${why}, using the active Pi session model${active ? ` (${active})` : ""}`);
			}
		}
		if (settings.thinking) {
			this.pi.setThinkingLevel(settings.thinking as never);
			// Pi clamps a level the model cannot run (a non-reasoning model: off); say so, as pi-materia does.
			let now: unknown;
			try {
				now = typeof this.pi.getThinkingLevel === "function" ? this.pi.getThinkingLevel() : undefined;
			} catch {
				now = undefined;
			}
			if (typeof now === "string" && now && now !== settings.thinking) {
				this.warn(`materia thinking: configured thinking "${settings.thinking}" is not supported by the model; using ${now} instead`);
			}
		}
		if (!Array.isArray(settings.tools)) return undefined;
		const restore = this.pi.getActiveTools();
		this.pi.setActiveTools(settings.tools);
		return restore;
	}

	private restore(turn: Turn): void {
		if (turn.restoreTools) this.pi.setActiveTools(turn.restoreTools);
	}
}

/** How many hidden prompts of turn `turnId` are among `messages` (two: Pi delivered the copy it held of a turn sent again). */
function ownPrompts(messages: unknown[], turnId: string): number {
	return messages.filter((m) => (m as { details?: { castor_turn_id?: unknown } } | undefined)?.details?.castor_turn_id === turnId).length;
}

/** When the hidden prompt of turn `turnId` among `messages` was made (Pi stamps each message), if known. */
function promptTimestamp(messages: unknown[], turnId: string): number | undefined {
	const prompt = messages.find((m) => (m as { details?: { castor_turn_id?: unknown } } | undefined)?.details?.castor_turn_id === turnId) as { timestamp?: unknown } | undefined;
	return typeof prompt?.timestamp === "number" ? prompt.timestamp : undefined;
}

/** Whether a user message was queued before the turn's prompt was made (an abort left it in Pi's queue). */
function queuedBefore(message: Record<string, unknown>, promptAt: number | undefined): boolean {
	return promptAt !== undefined && typeof message.timestamp === "number" && message.timestamp < promptAt;
}

/** Whether a Pi usage counts no tokens at all (absent, or every count zero or unreadable). */
function countsNoTokens(usage: unknown): boolean {
	if (usage === null || typeof usage !== "object") return true;
	const u = usage as Record<string, unknown>;
	const counts = [u.input, u.output, u.cacheRead, u.cacheWrite, u.totalTokens];
	return counts.every((v) => !(typeof v === "number" && Number.isFinite(v) && v > 0));
}
