/**
 * Pure helpers over Pi's message shapes (no Pi imports, no IO).
 *
 * Flattening (as the Icarus hooks read text): a string is used as is; an array is flattened element by
 * element, empty parts dropped, joined with "\n"; an object contributes its string `text`
 * (text blocks) or string `content`; anything else (thinking, tool calls, images) is "".
 */

export function flattenText(content: unknown): string {
	if (typeof content === "string") return content;
	if (Array.isArray(content)) return content.map(flattenText).filter((s) => s.length > 0).join("\n");
	if (content !== null && typeof content === "object") {
		const c = content as Record<string, unknown>;
		if (c.type !== undefined && c.type !== "text") return "";
		if (typeof c.text === "string") return c.text;
		if (typeof c.content === "string") return c.content;
	}
	return "";
}

/**
 * A `before_agent_start` prompt as castor reads it: a string as is, content blocks flattened
 * ({@link flattenText}: images and other non-text blocks contribute nothing), absent as null.
 */
export function promptText(prompt: unknown): string | null {
	if (prompt === undefined || prompt === null) return null;
	return typeof prompt === "string" ? prompt : flattenText(prompt);
}

export interface WireUsage {
	input: number;
	output: number;
	cache_read: number;
	cache_write: number;
	total_tokens: number;
	cost: number | null;
}

export function emptyUsage(): WireUsage {
	return { input: 0, output: 0, cache_read: 0, cache_write: 0, total_tokens: 0, cost: null };
}

/** The largest usage figure counted (castor caps its figures and sums at the same 10^18). */
const MAX_FIGURE = 1e18;

/** A usage figure as castor counts it: a finite, non-negative number (capped), else not reported. */
function figure(value: unknown): number | null {
	return typeof value === "number" && Number.isFinite(value) && value >= 0 ? Math.min(value, MAX_FIGURE) : null;
}

/**
 * Add one Pi `Usage` into a wire usage (snake_case; unknown cost stays null). A figure that is not a
 * finite, non-negative number (a provider's string, NaN, Infinity, a negative, a boolean) is not
 * reported, as castor reads it, so the sum is always a finite number: a NaN cost used to make it NaN.
 * Pi makes `totalTokens` by plain addition, where a `true` count adds 1 (10 + true = 11): that 1 is
 * taken off again (never below the parts counted), as castor does.
 */
export function addUsage(total: WireUsage, usage: unknown): WireUsage {
	if (usage === null || typeof usage !== "object") return total;
	const u = usage as Record<string, unknown>;
	const num = (v: unknown) => figure(v) ?? 0;
	const add = (a: number, b: number) => Math.min(a + b, MAX_FIGURE);
	const cost = u.cost as Record<string, unknown> | undefined;
	const costTotal = cost !== null && typeof cost === "object" ? figure(cost.total) : null;
	const parts = [u.input, u.output, u.cacheRead, u.cacheWrite];
	const ones = parts.filter((v) => v === true).length;
	const turnTotal = ones ? Math.max(num(u.totalTokens) - ones, parts.reduce((a: number, v) => add(a, num(v)), 0)) : num(u.totalTokens);
	return {
		input: add(total.input, num(u.input)),
		output: add(total.output, num(u.output)),
		cache_read: add(total.cache_read, num(u.cacheRead)),
		cache_write: add(total.cache_write, num(u.cacheWrite)),
		total_tokens: add(total.total_tokens, turnTotal),
		cost: costTotal === null ? total.cost : add(total.cost ?? 0, costTotal),
	};
}

/**
 * A usage map as plain JSON for castor, with a number JSON cannot hold (NaN, Infinity) written as
 * its name (`"NaN"`, `"Infinity"`): castor counts it as not reported either way, and names it to
 * the user (usage.json `turns[].unreadable`) -- dropped, it vanished without a word.
 */
export function plainUsage(usage: unknown): unknown {
	try {
		const text = JSON.stringify(usage, (_key, value) => (typeof value === "number" && !Number.isFinite(value) ? String(value) : value));
		return text === undefined ? null : JSON.parse(text);
	} catch {
		return null;
	}
}

/**
 * What an assistant message says of who answered and at what cost, for castor's usage report:
 * its `usage` map as the provider wrote it (castor reads every alias pi-materia reads, so nothing
 * is summed or renamed here), and `model` `{provider, id, api}` and `thinking_level`.
 */
export function answerFields(message: Record<string, unknown>): Record<string, unknown> {
	const str = (v: unknown) => (typeof v === "string" && v ? v : null);
	const out: Record<string, unknown> = {};
	if (message.usage !== null && typeof message.usage === "object") out.usage = plainUsage(message.usage);
	if (str(message.model)) out.model = { provider: str(message.provider), id: str(message.model), api: str(message.api) };
	if (str(message.thinkingLevel)) out.thinking_level = message.thinkingLevel;
	return out;
}

/** A compact, wire-friendly view of a Pi message (role, text, stop reason, custom type; an answer's usage and model). */
export function summarizeMessage(message: unknown): Record<string, unknown> {
	const m = (message ?? {}) as Record<string, unknown>;
	// A message's text goes to castor cut at 1 MiB (what it keeps of a turn for memory capture):
	// a model's or a tool's megabytes would otherwise be over what castor's wire carries.
	const text = cutText(flattenText(m.content), MAX_SUMMARY_TEXT_BYTES);
	const out: Record<string, unknown> = { role: m.role ?? null, text: text.text };
	if (text.cutFrom !== undefined) out.text_cut_from = text.cutFrom;
	if (m.role === "assistant") {
		out.stop_reason = m.stopReason ?? null;
		out.error = typeof m.errorMessage === "string" ? m.errorMessage : null;
		Object.assign(out, answerFields(m));
	}
	if (typeof m.customType === "string") out.custom_type = m.customType;
	if (typeof m.toolName === "string") out.tool_name = m.toolName;
	return out;
}

/** snake_case wire message → Pi custom message (`{customType, content, display, details}`). */
export function toPiCustomMessage(wire: unknown, fallbackType: string): { customType: string; content: string; display: boolean; details?: unknown } | undefined {
	if (wire === null || typeof wire !== "object") return undefined;
	const w = wire as Record<string, unknown>;
	const content = typeof w.content === "string" ? w.content : flattenText(w.content);
	if (!content.trim()) return undefined;
	const msg: { customType: string; content: string; display: boolean; details?: unknown } = {
		customType: typeof w.custom_type === "string" ? w.custom_type : fallbackType,
		content,
		display: w.display === true,
	};
	if (w.details !== undefined && w.details !== null) msg.details = w.details;
	return msg;
}

/** The most of a turn's answer sent to castor, in UTF-8 bytes: under the 8 MiB a string may be on
 * castor's wire, with room for the rest of the frame. */
export const MAX_TURN_TEXT_BYTES = 6 * 1024 * 1024;

/** The most of one message's text sent in a lifecycle event's summary (`summarizeMessage`). */
export const MAX_SUMMARY_TEXT_BYTES = 1024 * 1024;

/**
 * `text` cut to at most `maxBytes` of UTF-8 on a character boundary, and its whole length in
 * bytes when it was cut (`cutFrom`); `text` itself when it fits.
 */
export function cutText(text: string, maxBytes: number = MAX_TURN_TEXT_BYTES): { text: string; cutFrom?: number } {
	if (text.length <= maxBytes / 4) return { text }; // no UTF-8 character takes more than 4 bytes
	const bytes = new TextEncoder().encode(text);
	if (bytes.length <= maxBytes) return { text };
	let end = maxBytes;
	while (end > 0 && (bytes[end] & 0xc0) === 0x80) end--; // not inside a character's bytes
	return { text: new TextDecoder().decode(bytes.subarray(0, end)), cutFrom: bytes.length };
}
