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
 * Guarantees: each dispatched turn yields exactly one outcome (success, error, or a
 * dispatch failure reported immediately); a user run never reports a castor turn.
 */
import { addUsage, emptyUsage, flattenText, type WireUsage } from "./messages";

export const TURN_MESSAGE_TYPE = "castor-turn";

export interface RunTurnParams {
	session_id?: string;
	turn_id: string;
	prompt: string;
	summary?: string | null;
	custom_type?: string | null;
	model?: { provider: string; id: string } | null;
	thinking?: string | null;
	tools?: string[] | null;
	isolate?: boolean | null;
}

export interface TurnOutcome {
	session_id: string;
	turn_id: string;
	text: string;
	stop_reason: string | null;
	error: string | null;
	usage: WireUsage;
	aborted: boolean;
	entry_id: string | null;
}

interface Turn {
	turnId: string;
	customType: string;
	isolate: boolean;
	restoreTools?: string[];
	usage: WireUsage;
	last?: Record<string, unknown>;
}

/** The subset of Pi's ExtensionAPI this module uses. */
export interface TurnHost {
	sendMessage(message: { customType: string; content: string; display: boolean; details?: unknown }, options?: { triggerTurn?: boolean; deliverAs?: "steer" | "followUp" | "nextTurn" }): void;
	getActiveTools(): string[];
	setActiveTools(names: string[]): void;
	setModel(model: unknown): Promise<boolean>;
	setThinkingLevel(level: never): void;
}

export class TurnTracker {
	private readonly queued: Turn[] = [];
	private current: Turn | undefined;

	constructor(private readonly pi: TurnHost) {}

	get active(): Turn | undefined {
		return this.current;
	}

	/**
	 * Apply model/thinking/tool scope and send the hidden prompt. Throws (after undoing the
	 * tool scope) when Pi refuses the message; the caller reports that as the turn's error.
	 */
	async dispatch(params: RunTurnParams, ctx: { isIdle(): boolean; modelRegistry?: { find?(p: string, id: string): unknown } }): Promise<void> {
		const turn: Turn = {
			turnId: String(params.turn_id),
			customType: params.custom_type || TURN_MESSAGE_TYPE,
			isolate: params.isolate === true,
			usage: emptyUsage(),
		};
		if (params.model?.provider && params.model?.id) {
			const model = ctx.modelRegistry?.find?.(params.model.provider, params.model.id);
			if (!model) throw new Error(`unknown model ${params.model.provider}/${params.model.id}`);
			await this.pi.setModel(model);
		}
		if (params.thinking) this.pi.setThinkingLevel(params.thinking as never);
		if (Array.isArray(params.tools)) {
			turn.restoreTools = this.pi.getActiveTools();
			this.pi.setActiveTools(params.tools);
		}
		if (params.summary) {
			this.pi.sendMessage({ customType: "pi-materia", content: params.summary, display: true }, { triggerTurn: false });
		}
		this.queued.push(turn);
		try {
			const message = { customType: turn.customType, content: params.prompt, display: false, details: { castor_turn_id: turn.turnId } };
			this.pi.sendMessage(message, ctx.isIdle() ? { triggerTurn: true } : { triggerTurn: true, deliverAs: "followUp" });
		} catch (err) {
			this.queued.splice(this.queued.indexOf(turn), 1);
			this.restore(turn);
			throw err;
		}
	}

	/** Pi 1.x: bind by the custom message that started the run. */
	bindFromMessage(message: unknown): boolean {
		const details = (message as { details?: { castor_turn_id?: unknown } } | undefined)?.details;
		const id = details?.castor_turn_id;
		if (typeof id !== "string") return false;
		const index = this.queued.findIndex((t) => t.turnId === id);
		if (index < 0) return false;
		this.current = this.queued.splice(index, 1)[0];
		return true;
	}

	/** Pi 0.73 fallback: a run that starts while a turn is queued and none is bound is that turn. */
	bindOnAgentStart(): void {
		if (!this.current && this.queued.length > 0) this.current = this.queued.shift();
	}

	onAgentEnd(messages: unknown[]): void {
		const turn = this.current;
		if (!turn) return;
		for (const m of messages) {
			const msg = m as Record<string, unknown>;
			if (msg?.role !== "assistant") continue;
			turn.usage = addUsage(turn.usage, msg.usage);
			turn.last = msg;
		}
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
		const last = turn.last;
		const stopReason = typeof last?.stopReason === "string" ? last.stopReason : null;
		let error: string | null = null;
		if (!last) error = "Pi agent turn ended without an assistant response";
		else if (stopReason === "error") error = typeof last.errorMessage === "string" ? last.errorMessage : "unknown agent error";
		return {
			session_id: sessionId,
			turn_id: turn.turnId,
			text: last ? flattenText(last.content).trim() : "",
			stop_reason: stopReason,
			error,
			usage: turn.usage,
			aborted: aborted || stopReason === "aborted",
			entry_id: entryId,
		};
	}

	private restore(turn: Turn): void {
		if (turn.restoreTools) this.pi.setActiveTools(turn.restoreTools);
	}
}
