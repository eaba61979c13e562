/**
 * Where castor's stderr and this extension's own log lines go.
 *
 * Pi's terminal UI owns the terminal: a line written to stderr behind its back is drawn into the
 * middle of its screen (castor's "listening on stdio" line at every start, a warning of castor's,
 * a failed lifecycle call's log line) until Pi happens to redraw that part. So while Pi shows its
 * terminal UI (`ctx.mode === "tui"`), the text is only kept, the last {@link TAIL_BYTES} of it: it
 * goes with the error notice when castor stops, and `/castor status` shows its last lines. In every
 * other mode (RPC, JSON, print, and a Pi without `ctx.mode`) stderr is a log stream and the text goes
 * there as it comes, as before; it is kept as well.
 */

export const TAIL_BYTES = 32 * 1024;

const STARTED_ON_STDIO = "castor serve: listening on stdio";

/** Whether `line` is the line a runtime on stdio prints as it starts: plain, or (a castor whose log is
 * JSON, `CASTOR_LOG_JSON=1`) as the message of one JSON log line. */
export function isStartLine(line: string): boolean {
	if (line.startsWith(STARTED_ON_STDIO)) return true;
	if (!line.startsWith("{")) return false;
	try {
		const message = JSON.parse(line)?.record?.message;
		return typeof message === "string" && message.startsWith(STARTED_ON_STDIO);
	} catch {
		return false;
	}
}

/** The mode Pi reports, or undefined (a Pi without it, or a stale context that throws). */
export type ModeOf = () => string | undefined;

export class StderrRoute {
	private tail = "";
	private readonly modeOf: ModeOf;
	private readonly write: (text: string) => void;

	constructor(modeOf: ModeOf, write: (text: string) => void = (text) => process.stderr.write(text)) {
		this.modeOf = modeOf;
		this.write = write;
	}

	/** Route `text` (castor's stderr as it comes, or a log line with its newline). */
	push(text: string): void {
		this.tail = (this.tail + text).slice(-TAIL_BYTES);
		if (this.modeOf() !== "tui") this.write(text);
	}

	/** The last `n` non-empty lines kept that `wanted` accepts, oldest first. */
	lastLines(n: number, wanted: (line: string) => boolean = () => true): string[] {
		const lines = this.tail.split("\n").map((line) => line.trimEnd()).filter((line) => line && wanted(line));
		return lines.slice(-n);
	}
}
