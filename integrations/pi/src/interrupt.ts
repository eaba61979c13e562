/**
 * The user's Esc while a `before_agent_start` handler waits for castor.
 *
 * Pi 1.6 gives `before_agent_start` no abort signal. An Esc pressed while the handler runs makes
 * Pi ask for the run to be aborted, and Pi then waits for the handler to return before it aborts
 * it (at `agent_start`, before the first request). The handler waits for castor's answer, which
 * for a user's prompt is Icarus' memory retrieval, bounded only by its timeout: without this,
 * the Esc took effect when the retrieval ended, seconds later.
 *
 * In Pi's interactive mode an extension sees the terminal's keys (`ctx.ui.onTerminalInput`). While
 * the handler waits, {@link EscWatch} listens there; an Esc aborts its signal, the handler stops
 * waiting and returns nothing, and Pi aborts the run at once. castor's call runs on (the protocol
 * has no cancel for it) and its answer is dropped. The key is only watched, never consumed: Pi
 * still sees it and does the abort itself. Elsewhere (RPC and print mode, where
 * `onTerminalInput` is a no-op, or a Pi without it) the signal never fires and the handler waits
 * as before.
 *
 * What this does not know: a rebound interrupt key. Pi's default is Esc (`app.interrupt`); a user
 * who rebound it and presses Esc during the wait gets this prompt without memory context (the
 * handler said so in a notice) and Pi runs it; their interrupt key works as Pi's always did.
 */

/** Esc as the terminal sends it: a lone ESC byte, or (keyboard protocols Pi may turn on) the
 * kitty `CSI 27 u` form with no modifier (a key press or repeat, not its release), or xterm's
 * modifyOtherKeys `CSI 27;1;27 ~`. An escape *sequence* (an arrow key, Alt+x) is not Esc. */
export function isEscapeKey(data: string): boolean {
	if (data === "\x1b") return true;
	const kitty = /^\x1b\[27(?:;1(?::([123]))?)?u$/.exec(data);
	if (kitty) return kitty[1] !== "3"; // event type 3: the key's release
	return data === "\x1b[27;1;27~";
}

/** Ctrl+C as the terminal sends it: the ETX byte, or the kitty `CSI 99;5 u` press/repeat. */
export function isCtrlC(data: string): boolean {
	if (data === "\x03") return true;
	const kitty = /^\x1b\[99;5(?::([123]))?u$/.exec(data);
	return kitty !== null && kitty[1] !== "3";
}

/** Ctrl+D as the terminal sends it: the EOT byte, or the kitty `CSI 100;5 u` press/repeat. */
export function isCtrlD(data: string): boolean {
	if (data === "\x04") return true;
	const kitty = /^\x1b\[100;5(?::([123]))?u$/.exec(data);
	return kitty !== null && kitty[1] !== "3";
}

/** Pi quits on a second Ctrl+C within this long of the first (its `handleCtrlC`). */
export const DOUBLE_CTRL_C_MS = 500;

/** What listening needs from Pi's extension context (typed loosely: Pi 0.73 and 1.x). */
export interface TerminalCtx {
	hasUI?: boolean;
	ui?: { onTerminalInput?: (handler: (data: string) => unknown) => () => void; getEditorText?: () => string };
}

/**
 * Watches the terminal for an Esc until {@link EscWatch.dispose}; `signal` aborts at the first.
 * Pi's quit keys end the wait too (`quitting`): a second Ctrl+C within {@link DOUBLE_CTRL_C_MS},
 * or Ctrl+D with an empty editor. Pi's quit waits for the run, and the run for this handler: a
 * quit during a slow retrieval used to take the whole retrieval (20 s and more) to exit.
 */
export class EscWatch {
	readonly signal: AbortSignal | undefined;
	private readonly unsubscribe: (() => void) | undefined;
	private quit = false;

	constructor(ctx: TerminalCtx | undefined, now: () => number = Date.now) {
		const subscribe = ctx?.hasUI ? ctx.ui?.onTerminalInput : undefined;
		if (typeof subscribe !== "function") return;
		const controller = new AbortController();
		let lastCtrlC = Number.NEGATIVE_INFINITY;
		const editorEmpty = () => {
			try {
				return typeof ctx?.ui?.getEditorText !== "function" || ctx.ui.getEditorText().length === 0;
			} catch {
				return true;
			}
		};
		try {
			this.unsubscribe = subscribe.call(ctx?.ui, (data: string) => {
				if (typeof data !== "string") return undefined;
				if (isEscapeKey(data)) controller.abort();
				else if (isCtrlC(data)) {
					const at = now();
					if (at - lastCtrlC < DOUBLE_CTRL_C_MS) {
						this.quit = true;
						controller.abort();
					}
					lastCtrlC = at;
				} else if (isCtrlD(data) && editorEmpty()) {
					this.quit = true;
					controller.abort();
				}
				return undefined; // never consumed: Pi handles the key as always
			});
		} catch {
			return; // no terminal to listen to: wait as before
		}
		this.signal = controller.signal;
	}

	/** Whether an Esc (or a quit key) was seen. */
	get pressed(): boolean {
		return this.signal?.aborted ?? false;
	}

	/** Whether the wait ended because the user is quitting Pi (no notice: Pi is going away). */
	get quitting(): boolean {
		return this.quit;
	}

	dispose(): void {
		try {
			this.unsubscribe?.();
		} catch {
			// the UI is gone (Pi is shutting down): nothing left to unsubscribe from
		}
	}
}
