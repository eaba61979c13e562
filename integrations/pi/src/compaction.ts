/**
 * castor's host-context methods on Pi's own session: `session.context_usage` and `session.compact`.
 *
 * castor's materia turns run inside the Pi session, whose transcript (each turn's hidden prompt,
 * its tool output, its answer) accumulates. castor reads its usage before a turn (proactive
 * compaction, docs/materia.md) and compacts it for a same-socket retry after a context-window
 * failure — through Pi's own `ctx.getContextUsage()` and
 * `ctx.compact({customInstructions, onComplete, onError})` (Pi ≥ 0.73; compaction asks the session
 * model for a summary).
 *
 * | castor asks | Pi answer | castor gets |
 * |---|---|---|
 * | `session.context_usage {session_id}` | `ContextUsage` | `{tokens, contextWindow, percent}` (nulls where Pi does not know) |
 * | | undefined (no model, no window) | nil: "usage unknown", no proactive compaction |
 * | `session.compact {session_id, cast_id, instructions}` | `onComplete(result)` | `{tokensBefore, tokensAfter, entriesRemoved, summaryTokens, firstKeptEntryId}` |
 * | | `onError(err)` ("Nothing to compact (session too small)", "Already compacted", …) | error `compaction_failed` with Pi's message |
 * | | `onError(err)` after the user pressed Esc ("Compaction cancelled", an `AbortError`) | error `cancelled` with Pi's message: castor keeps the cast (interrupted), as for an Esc during a turn |
 * | either, on a Pi without the API | – | error `unsupported` (castor: "no host context" / a failed recovery compaction) |
 *
 * The summary's text is never sent back (castor keeps only the counts). `entriesRemoved` is the
 * number of branch entries before the first kept one, since the previous compaction;
 * `summaryTokens` is the summary call's output tokens, else an estimate (chars / 4).
 * Guarantee: `compactSession` settles exactly once (Pi calls one of its callbacks once).
 */
import { RpcError, type Params } from "./rpc.ts";

type Ctx = any; // Pi's ExtensionContext (loosely typed: Pi 0.73 and 1.x)

export interface WireContextUsage {
	tokens: number | null;
	contextWindow: number | null;
	percent: number | null;
}

export interface CompactionSummary {
	tokensBefore: number | null;
	tokensAfter: number | null;
	entriesRemoved: number | null;
	summaryTokens: number | null;
	firstKeptEntryId: string | null;
}

function finite(value: unknown): number | null {
	return typeof value === "number" && Number.isFinite(value) && value >= 0 ? value : null;
}

/** `session.context_usage`: Pi's usage now, or null when Pi cannot tell. */
export function contextUsage(ctx: Ctx): WireContextUsage | null {
	if (typeof ctx?.getContextUsage !== "function") throw new RpcError("unsupported", "this Pi has no getContextUsage()");
	const usage = ctx.getContextUsage();
	if (!usage) return null;
	return { tokens: finite(usage.tokens), contextWindow: finite(usage.contextWindow), percent: finite(usage.percent) };
}

interface BranchEntry {
	id?: string;
	type?: string;
}

function branchOf(ctx: Ctx): BranchEntry[] {
	try {
		const branch = ctx?.sessionManager?.getBranch?.();
		return Array.isArray(branch) ? branch : [];
	} catch {
		return [];
	}
}

/** Entries summarised away: those before the first kept entry, after the previous compaction. */
export function entriesRemoved(branch: BranchEntry[], firstKeptEntryId: unknown): number | null {
	const kept = branch.findIndex((e) => e?.id === firstKeptEntryId);
	if (kept < 0) return null;
	let start = 0;
	for (let i = kept - 1; i >= 0; i--) {
		if (branch[i]?.type === "compaction") {
			start = i + 1;
			break;
		}
	}
	return kept - start;
}

/** Pi's `CompactionResult` cut down to the counts castor records (never the summary text). */
export function compactionSummary(result: any, before: BranchEntry[]): CompactionSummary {
	const summary = typeof result?.summary === "string" ? result.summary : "";
	const outputTokens = finite(result?.usage?.output);
	return {
		tokensBefore: finite(result?.tokensBefore),
		tokensAfter: finite(result?.estimatedTokensAfter ?? result?.tokensAfter),
		entriesRemoved: entriesRemoved(before, result?.firstKeptEntryId),
		summaryTokens: outputTokens && outputTokens > 0 ? outputTokens : summary ? Math.ceil(summary.length / 4) : null,
		firstKeptEntryId: typeof result?.firstKeptEntryId === "string" ? result.firstKeptEntryId : null,
	};
}

/** Pi's compaction error on the wire: `cancelled` when the user stopped it (Esc), else `compaction_failed`. */
export function compactionError(err: unknown): RpcError {
	const message = err instanceof Error ? err.message : String(err);
	const aborted = (err instanceof Error && err.name === "AbortError") || /\b(cancell?ed|aborted)\b/i.test(message);
	return new RpcError(aborted ? "cancelled" : "compaction_failed", message);
}

/** `session.compact`: run Pi's compaction with castor's instructions; resolves with the summary. */
export function compactSession(ctx: Ctx, p: Params): Promise<CompactionSummary> {
	if (typeof ctx?.compact !== "function") return Promise.reject(new RpcError("unsupported", "this Pi has no compact()"));
	const instructions = typeof p.instructions === "string" && p.instructions ? p.instructions : undefined;
	const before = branchOf(ctx);
	return new Promise((resolve, reject) => {
		try {
			ctx.compact({
				customInstructions: instructions,
				onComplete: (result: unknown) => resolve(compactionSummary(result, before)),
				onError: (err: unknown) => reject(compactionError(err)),
			});
		} catch (err) {
			reject(new RpcError("compaction_failed", err instanceof Error ? err.message : String(err)));
		}
	});
}

/** What Pi is doing, as the extension sees it (`isIdle()` and the runs it has heard start). */
export type PiActivity = "idle" | "compacting" | "run" | "gone";

/**
 * Waits for a compaction Pi is expected to begin once a run's settle is over -- the user's `/compact`
 * (an RPC `compact`) aborts the run going on, waits for Pi to be idle, then compacts. Pi tells no
 * extension that a compaction is coming: only its state shows it, `isIdle()` false with no run going
 * on. `probe` reads that state; it is first read after a macrotask (Pi's settle handlers, then its
 * idle wait, run before), then every `intervalMs` until `boundMs` has passed. Resolves with the first
 * state other than `idle`, or `timeout` if Pi stayed idle for the whole bound (the caller says so: a
 * compaction that begins later than that is one the turn no longer waits for). A bound of 0 reads
 * the state once. Deterministic under injected `sleep`/`now` (unit tests drive both orders).
 */
export async function compactionBegins(
	probe: () => PiActivity,
	boundMs: number,
	sleep: (ms: number) => Promise<void> = (ms) => new Promise((resolve) => setTimeout(resolve, ms)),
	now: () => number = Date.now,
	intervalMs = 10,
): Promise<PiActivity | "timeout"> {
	const deadline = now() + boundMs;
	await sleep(0);
	for (;;) {
		const state = probe();
		if (state !== "idle") return state;
		if (now() >= deadline) return "timeout";
		await sleep(intervalMs);
	}
}
