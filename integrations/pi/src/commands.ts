/**
 * `/materia …` and `/icarus …` → castor method calls (pure: parsing only).
 *
 * | command                      | method          | params (besides session_id, cwd)  |
 * |------------------------------|-----------------|-----------------------------------|
 * | /materia cast <request>      | cast.start      | request                           |
 * | /materia continue            | cast.continue   |                                   |
 * | /materia abort               | cast.abort      |                                   |
 * | /materia recast [id]         | cast.recast     | cast_id?                          |
 * | /materia revive [id]         | cast.revive     | cast_id?                          |
 * | /materia status              | cast.status     |                                   |
 * | /materia casts               | cast.list       |                                   |
 * | /materia grid [loadout]      | grid.render     | loadout?                          |
 * | /materia loadout             | loadout.list    |                                   |
 * | /materia loadout <name>      | loadout.set     | name                              |
 * | /icarus <args>               | icarus.command  | args (the raw argument string)    |
 *
 * Arguments are split on whitespace and the rest rejoined with single spaces. Anything else
 * is a usage error (no call is made).
 *
 * While Pi runs a turn, `abort` and the read-only commands (`status`, `casts`, `grid`,
 * `loadout` without a name) and usage errors run at once ({@link runsWhileBusy}); the
 * commands that start or resume turns wait until Pi is idle.
 *
 * A command's outcome is shown with `ui.notify` and is also the handler's return value
 * ({@link runPlanned}), as pi-icarus-hook's `/icarus` handler returns its reply.
 */

/** In pi-materia's completion order (its `link` and `ui` are not castor's). */
export const MATERIA_SUBCOMMANDS = ["cast", "recast", "revive", "casts", "grid", "loadout", "status", "continue", "abort"] as const;

export const MATERIA_USAGE =
	"Usage: /materia cast <request> | continue | abort | recast [cast-id] | revive [cast-id] | status | casts | grid [loadout] | loadout [name]. " +
	"A cast paused for refinement resumes with /materia continue.";

/** Methods a `/materia` command calls without waiting for Pi to be idle. */
export const IMMEDIATE_METHODS: ReadonlySet<string> = new Set(["cast.abort", "cast.status", "cast.list", "grid.render", "loadout.list"]);

/** pi-materia's subcommands castor leaves out, and what to do instead. */
const NOT_PROVIDED: Record<"ui" | "link", string> = {
	ui: "edit the materia config file; /materia grid shows a loadout",
	link: "start a new cast with /materia cast",
};

export type Planned = { method: string; params: Record<string, unknown> } | { usage: string };

/** The most characters of a typed word a usage error quotes (the rest is `…`). */
const QUOTED_MAX = 40;

/**
 * `text` as a usage error quotes it: in double quotes, at most {@link QUOTED_MAX} characters (a
 * longer text keeps its first 39 and ends with `…`; a character is a code point, never half of one),
 * each control character written as its `\uXXXX` escape. A pasted word thousands of characters
 * long used to be echoed whole, and an escape sequence in it reached the terminal.
 */
export function quoted(text: string): string {
	const kept = Array.from(text).length > QUOTED_MAX ? `${firstChars(text, QUOTED_MAX - 1)}…` : text;
	return `"${kept.replace(/[\u0000-\u001f\u007f-\u009f]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`)}"`;
}

/** The usage error for words a subcommand does not take: what it takes, the words, then the usage. */
function extraWords(sub: string, takes: string, words: string[]): { usage: string } {
	return { usage: `/materia ${sub} takes ${takes} (got ${quoted(words.join(" "))}). ${MATERIA_USAGE}` };
}

export function planMateria(args: string): Planned {
	const words = args.trim().split(/\s+/).filter(Boolean);
	const sub = words.shift() ?? "";
	const rest = words.join(" ");
	switch (sub) {
		case "cast":
			return rest ? { method: "cast.start", params: { request: rest } } : { usage: `/materia cast needs a request. ${MATERIA_USAGE}` };
		case "continue":
		case "abort":
		case "status":
			return words.length ? extraWords(sub, "no arguments", words) : { method: `cast.${sub}`, params: {} };
		case "casts":
			return words.length ? extraWords(sub, "no arguments", words) : { method: "cast.list", params: {} };
		case "recast":
		case "revive":
			if (words.length > 1) return extraWords(sub, "at most one cast id", words);
			return { method: `cast.${sub}`, params: words.length ? { cast_id: words[0] } : {} };
		case "grid":
			return { method: "grid.render", params: rest ? { loadout: rest } : {} };
		case "loadout":
			return rest ? { method: "loadout.set", params: { name: rest } } : { method: "loadout.list", params: {} };
		case "ui":
		case "link":
			return { usage: `/materia ${sub} is pi-materia's and castor does not provide it (${NOT_PROVIDED[sub]}). ${MATERIA_USAGE}` };
		default:
			return { usage: sub ? `Unknown /materia subcommand ${quoted(sub)}. ${MATERIA_USAGE}` : MATERIA_USAGE };
	}
}

/** The first `max` characters of `text`, a character being a code point (an emoji is never cut in half). */
function firstChars(text: string, max: number): string {
	return Array.from(text).slice(0, max).join("");
}

/**
 * Pi's session name for a cast: `materia: ` and the request's first 60 characters (code points:
 * a UTF-16 slice left half an emoji at the end, shown as a broken character).
 */
export function castSessionName(request: string): string {
	return `materia: ${firstChars(request, 60)}`;
}

/** One cast as `cast.list` answers it (only the fields completions read). */
export type CastRow = { cast_id?: unknown; status?: unknown; resumable?: unknown; revivable?: unknown; current_socket?: unknown; request?: unknown; failed_reason?: unknown; last_message?: unknown };

export type Completion = { value: string; label: string; description?: string };

/** The subcommands whose argument is a cast id (they complete to the casts they take). */
export function completesCastIds(prefix: string): "recast" | "revive" | null {
	const m = /^\s*(recast|revive)(\s+\S*)$/.exec(prefix);
	return m ? (m[1] as "recast" | "revive") : null;
}

function oneLine(value: unknown, max: number): string {
	const text = typeof value === "string" ? value.replace(/\s+/g, " ").trim() : "";
	return Array.from(text).length > max ? `${firstChars(text, max - 1)}…` : text;
}

/**
 * Completions of `/materia <prefix>`: the subcommand names while the first word is typed; after
 * `recast ` / `revive `, the ids of the casts each takes (resumable / revivable), newest first,
 * labelled `<id>  <aborted|failed|revivable>  socket:<id>`, described by the request (else the
 * failure) on one line of at most 72 characters. A value replaces the whole argument text.
 * `casts` is `cast.list`'s rows (null: unknown).
 */
export function materiaCompletions(prefix: string, casts: CastRow[] | null): Completion[] | null {
	const tokens = prefix.trim().split(/\s+/).filter(Boolean);
	const open = /\s$/.test(prefix);
	if (tokens.length === 0) return MATERIA_SUBCOMMANDS.map((s) => ({ value: s, label: s }));
	if (tokens.length === 1 && !open) {
		const items = MATERIA_SUBCOMMANDS.filter((s) => s.startsWith(tokens[0]!)).map((s) => ({ value: s, label: s }));
		return items.length ? items : null;
	}
	const sub = completesCastIds(prefix);
	if (!sub || !casts) return null;
	const typed = open ? "" : (tokens[1] ?? "");
	const items: Completion[] = [];
	for (const row of casts) {
		const id = typeof row.cast_id === "string" ? row.cast_id : "";
		if (!id || !id.startsWith(typed) || row.resumable !== true) continue;
		if (sub === "revive" && row.revivable !== true) continue;
		const status = sub === "revive" ? "revivable" : row.status === "aborted" ? "aborted" : "failed";
		const socket = typeof row.current_socket === "string" && row.current_socket ? row.current_socket : "-";
		const item: Completion = { value: `${sub} ${id}`, label: `${id}  ${status}  socket:${socket}` };
		const description = oneLine(row.request, 72) || oneLine(row.failed_reason, 72) || oneLine(row.last_message, 72);
		if (description) item.description = description;
		items.push(item);
	}
	return items.length ? items : null;
}

/** Whether a planned `/materia` command runs while a turn is in flight (else it waits for idle). */
export function runsWhileBusy(planned: Planned): boolean {
	return "usage" in planned || IMMEDIATE_METHODS.has(planned.method);
}

export function planIcarus(args: string): Planned {
	return { method: "icarus.command", params: { args: args.trim().split(/\s+/).filter(Boolean).join(" ") } };
}

/** The text to show for a command result: `text`, else `message`, else compact JSON. */
export function resultText(result: unknown): { text: string; level: "info" | "warning" | "error" } {
	if (typeof result === "string") return { text: result, level: "info" };
	const r = (result ?? {}) as Record<string, unknown>;
	const level = r.level === "warning" || r.level === "error" ? r.level : "info";
	if (typeof r.text === "string") return { text: r.text, level };
	if (typeof r.message === "string") return { text: r.message, level };
	return { text: JSON.stringify(result ?? null), level };
}

export type Level = "info" | "warning" | "error";

/** Cast commands whose refusal for want of a cast is a notice, not a failure (see {@link isNothingToActOn}). */
const NOTHING_TO_ACT_ON_METHODS: ReadonlySet<string> = new Set(["cast.continue", "cast.abort", "cast.recast", "cast.revive", "cast.status"]);

/**
 * Whether castor's refusal (its error `code`) of `planned` says there is nothing to act on: no
 * cast to continue, abort, recast, revive or show. That is castor's `not_found` for one of those
 * commands given no cast id; pi-materia tells it as a plain info notice ("No active pi-materia
 * cast to abort."), not as a failure. A cast id the user named and castor does not know stays an
 * error.
 */
export function isNothingToActOn(planned: Planned, code: string | undefined): boolean {
	return code === "not_found" && "method" in planned && NOTHING_TO_ACT_ON_METHODS.has(planned.method) && !("cast_id" in planned.params);
}

/**
 * Run a planned command: `call` castor (it applies the result's effects), show the outcome once
 * with `show`, and return the text shown. A usage error is shown as a warning without a call; a
 * failed call shows `describeError(err)`: a text is an error, a `{text, level}` says its level.
 */
export async function runPlanned(
	planned: Planned,
	call: (method: string, params: Record<string, unknown>) => Promise<unknown>,
	show: (text: string, level: Level) => void,
	describeError: (err: unknown) => string | { text: string; level: Level },
): Promise<string> {
	let shown: { text: string; level: Level };
	if ("usage" in planned) {
		shown = { text: planned.usage, level: "warning" };
	} else {
		try {
			shown = resultText(await call(planned.method, planned.params));
		} catch (err) {
			const described = describeError(err);
			shown = typeof described === "string" ? { text: described, level: "error" } : described;
		}
	}
	show(shown.text, shown.level);
	return shown.text;
}

/** A `/materia` argument castor's params name, as the user knows it, and what lists the valid ones. */
const TYPED_ARGUMENTS: Record<string, { word: string; lists: string }> = {
	request: { word: "request", lists: "Shorten the request." },
	loadout: { word: "loadout name", lists: "/materia loadout lists the loadouts." },
	name: { word: "loadout name", lists: "/materia loadout lists the loadouts." },
	cast_id: { word: "cast id", lists: "/materia casts lists the casts." },
};

/**
 * What to tell the user when castor refuses (`invalid_params`) an argument they typed: the argument
 * by its name in the command (the loadout name, the cast id, the request) with its length, castor's
 * reason, and what lists the valid ones. `data` is the error's data (`errors` `[{loc, msg}]`).
 * Undefined when no error names an argument the user typed (castor's own params are a bug to
 * report as is). A loadout name of 3,000 characters read only "invalid params for grid.render".
 */
export function refusedArgumentText(planned: Planned, data: unknown): string | undefined {
	if (!("method" in planned)) return undefined;
	const errors = (data as { errors?: unknown } | null | undefined)?.errors;
	if (!Array.isArray(errors)) return undefined;
	for (const error of errors as Array<{ loc?: unknown; msg?: unknown }>) {
		const loc = typeof error?.loc === "string" ? error.loc : "";
		const typed = planned.params[loc];
		const argument = Object.hasOwn(TYPED_ARGUMENTS, loc) ? TYPED_ARGUMENTS[loc] : undefined;
		if (!argument || typeof typed !== "string") continue;
		const reason = typeof error.msg === "string" && error.msg ? error.msg : "not accepted";
		return `castor refused the ${argument.word} (${Array.from(typed).length} characters): ${reason}. ${argument.lists}`;
	}
	return undefined;
}
