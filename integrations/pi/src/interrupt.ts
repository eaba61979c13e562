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
 * Every other way Pi is stopped while the handler waits ends the wait the same way, because each
 * of them (Pi's `session.abort()`) also waits for the handler: Pi's quit keys (`quitting`), the
 * SIGTERM or SIGHUP Pi shuts down on (a process manager's stop, a closed terminal), and in RPC mode
 * the end of Pi's input (its client went away: `quitting`) and an RPC `abort` command (a client's
 * Esc) or another command that aborts the run and waits for it (a new session, a fork, a manual
 * compaction). A signal is only listened to when Pi itself has a handler for it, so a listener of ours
 * never turns a signal that would end the process into one that does not.
 *
 * In the interactive mode, so do the commands that stop the run when submitted (`/new`, `/compact`,
 * `/clone`, `/quit`) and the choice made in the picker `/resume` or `/fork` opens: each is seen as
 * the editor's Enter, its text read before the editor takes the key ({@link submitEffect}).
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

/** Enter as the terminal sends it: CR (or LF), or the kitty `CSI 13 u` press/repeat with no modifier. */
export function isEnterKey(data: string): boolean {
	if (data === "\r" || data === "\n") return true;
	const kitty = /^\x1b\[13(?:;1(?::([123]))?)?u$/.exec(data);
	return kitty !== null && kitty[1] !== "3";
}

/** Pi's interactive commands that open a picker whose choice leaves the run alone (a model, a setting). */
const PICKERS: ReadonlySet<string> = new Set(["/model", "/thinking", "/settings", "/scoped-models", "/tree", "/trust", "/login", "/logout"]);

/**
 * What submitting the editor's `text` makes Pi's interactive mode do to a run going on: `stop`,
 * a command that aborts the run and waits for it (`/new`, `/compact`, `/clone`); `quit` (`/quit`);
 * `choose`, a command that opens a picker whose choice replaces the session, aborting the run
 * then (`/resume`, `/fork`); `picker`, one that opens a picker whose choice does not touch the run
 * ({@link PICKERS}); `undefined` for anything else (a prompt, which Pi queues behind the run).
 * Either picker is closed by Esc, which then is not the user stopping the run.
 */
export function submitEffect(text: string): "stop" | "quit" | "choose" | "picker" | undefined {
	const command = text.trim();
	if (command === "/new" || command === "/clone" || command === "/compact" || command.startsWith("/compact ")) return "stop";
	if (command === "/quit") return "quit";
	if (command === "/resume" || command === "/fork") return "choose";
	if (PICKERS.has(command)) return "picker";
	return undefined;
}

/** Pi quits on a second Ctrl+C within this long of the first (its `handleCtrlC`). */
export const DOUBLE_CTRL_C_MS = 500;

/** What listening needs from Pi's extension context (typed loosely: Pi 0.73 and 1.x). */
export interface TerminalCtx {
	hasUI?: boolean;
	/** Pi's run mode: `tui`, `rpc`, `json`, `print` (Pi 1.x). */
	mode?: string;
	ui?: { onTerminalInput?: (handler: (data: string) => unknown) => () => void; getEditorText?: () => string };
}

type Listener = (...args: any[]) => void;

/** What watching the process needs (Node's `process`; a stand-in in tests). */
export interface ProcessLike {
	listenerCount(event: string): number;
	on(event: string, listener: Listener): unknown;
	off(event: string, listener: Listener): unknown;
	stdin?: { on(event: string, listener: Listener): unknown; off(event: string, listener: Listener): unknown; readableEnded?: boolean; readableFlowing?: boolean | null } | null;
}

/** The signals Pi shuts down on (interactive and RPC mode). */
export const QUIT_SIGNALS = ["SIGTERM", "SIGHUP"] as const;

/**
 * Pi's RPC commands that abort the run going on and wait for it (`session.abort()`): `abort` (a
 * client's Esc), a manual `compact`, and those that replace the session (`new_session`,
 * `switch_session`, `fork`, `clone`).
 */
export const RPC_RUN_STOPPERS: ReadonlySet<string> = new Set(["abort", "compact", "new_session", "switch_session", "fork", "clone"]);

/** Pi's RPC commands that give it a message to run (a prompt, or one for the run going on). */
export const RPC_PROMPTS: ReadonlySet<string> = new Set(["prompt", "steer", "follow_up"]);

/** The `type` of a whole RPC input line, if it is one of Pi's commands. */
function rpcType(line: string): string | undefined {
	if (!line.includes('"type"')) return undefined;
	try {
		const command = JSON.parse(line) as { type?: unknown } | null;
		return command !== null && typeof command === "object" && typeof command.type === "string" ? command.type : undefined;
	} catch {
		return undefined; // a line cut where the watch began, or not JSON: Pi answers it, not us
	}
}

/** A whole RPC input line that is one of Pi's commands that stop the run ({@link RPC_RUN_STOPPERS}). */
export function isRpcAbort(line: string): boolean {
	const type = rpcType(line);
	return type !== undefined && RPC_RUN_STOPPERS.has(type);
}

/** A whole RPC input line that gives Pi a message to run ({@link RPC_PROMPTS}). */
export function isRpcPrompt(line: string): boolean {
	const type = rpcType(line);
	return type !== undefined && RPC_PROMPTS.has(type);
}

/** Lines longer than this are not kept while looking for an `abort` (a prompt with a large paste). */
const MAX_LINE_CHARS = 1 << 20;

/** A 'data' listener for Pi's RPC input that calls `onLine` with each whole line (chunks may cut
 * a line anywhere; a line past {@link MAX_LINE_CHARS} is dropped, not kept whole). */
function eachLine(onLine: (line: string) => void): (chunk: unknown) => void {
	let buffered = "";
	return (chunk: unknown) => {
		buffered += typeof chunk === "string" ? chunk : String(chunk);
		const lines = buffered.split("\n");
		buffered = lines.pop() ?? "";
		if (buffered.length > MAX_LINE_CHARS) buffered = "";
		for (const line of lines) onLine(line);
	};
}

/**
 * What a `session_start` handler whose wait Pi's quit keys ended waits for before it returns. Pi's
 * quit does not wait for the handler (Pi 1.6 runs its shutdown beside it), but what Pi does once
 * the handler returns comes first: the rest of Pi's own start, which loads its syntax grammars and
 * holds its event loop for half a second (seconds on a loaded machine), ran before the quit's next
 * step, and quitting while castor started took 2 s. Held, the quit runs alone and Pi exits while
 * this waits. It resolves when `work` (castor's start) settles while Pi is not shutting down
 * (`closing()` false: the keys were not Pi's quit after all -- Pi times the two Ctrl+C itself), or
 * after `holdMs` at the latest, for a Pi whose quit waits for the handler. Its timer never keeps
 * the process alive.
 */
export function holdWhileQuitting(work: Promise<unknown>, closing: () => boolean, holdMs: number): Promise<void> {
	return new Promise((resolve) => {
		const timer = setTimeout(resolve, holdMs);
		(timer as { unref?: () => void }).unref?.();
		const settled = () => {
			if (closing()) return; // Pi is shutting down: it exits before the timer
			clearTimeout(timer);
			resolve();
		};
		work.then(settled, settled);
	});
}

/** How long a prompt's `before_agent_start` waits for a retrieval an Esc stopped waiting for, which
 * castor answers first (its worker runs one at a time), before the prompt goes without castor's answer. */
export const BEHIND_STOPPED_MS = 2000;

/** What `boundedBehind` rejects with: the call ahead was still unanswered at the bound. */
export class StillBehind extends Error {
	constructor() {
		super("the call ahead is still unanswered");
	}
}

/**
 * `call`, waited for in full once `ahead` (a call castor answers first, which nobody waits for any
 * more) settles -- or sooner, should `call` settle first; if `ahead` is still unanswered after
 * `boundMs`, a rejection with {@link StillBehind} instead. No `ahead`: `call` itself.
 */
export function boundedBehind<T>(call: Promise<T>, ahead: Promise<unknown> | undefined, boundMs: number): Promise<T> {
	if (!ahead) return call;
	return new Promise<T>((resolve, reject) => {
		let done = false;
		const timer = setTimeout(() => {
			if (done) return;
			done = true;
			reject(new StillBehind());
		}, boundMs);
		const cleared = () => clearTimeout(timer);
		ahead.then(cleared, cleared);
		call.then(
			(value) => {
				if (done) return;
				done = true;
				clearTimeout(timer);
				resolve(value);
			},
			(err) => {
				if (done) return;
				done = true;
				clearTimeout(timer);
				reject(err);
			},
		);
	});
}

/** Why the wait ended: the user's Esc, an RPC client's `abort`, or Pi going away. */
export type WaitEnd = "esc" | "abort" | "quit";

/**
 * Watches for the user stopping the run until {@link EscWatch.dispose}; `signal` aborts at the
 * first: an Esc on the terminal; Pi's quit keys (`quitting`): a second Ctrl+C within
 * {@link DOUBLE_CTRL_C_MS}, or Ctrl+D with an empty editor. Pi's quit waits for the run, and the
 * run for this handler: a quit during a slow retrieval used to take the whole retrieval (20 s and
 * more) to exit. With `proc` (Node's `process`) also the signals Pi shuts down on and, in RPC
 * mode, the end of Pi's input (`quitting`) and an RPC `abort` command.
 */
export class EscWatch {
	readonly signal: AbortSignal | undefined;
	private readonly cleanups: Array<() => void> = [];
	private ended: WaitEnd | undefined;
	/** A prompt was submitted during the wait (an RPC `prompt`, or the editor's Enter on a message). */
	private submitted = false;
	private submittedBeforeEnd = false;

	/** `isStop` tells the user's Esc from one a picker, a dialog or the completion list takes
	 * ({@link escIsAStop}); `undefined` (not known) counts the Esc, as does a picker's own tracking. */
	constructor(ctx: TerminalCtx | undefined, now: () => number = Date.now, proc?: ProcessLike,
		isStop: () => boolean | undefined = () => undefined) {
		const controller = new AbortController();
		const end = (why: WaitEnd) => {
			if (this.ended) return;
			this.ended = why;
			this.submittedBeforeEnd = this.submitted;
			controller.abort();
		};
		let watching = false;
		const subscribe = ctx?.hasUI ? ctx.ui?.onTerminalInput : undefined;
		if (typeof subscribe === "function") {
			let lastCtrlC = Number.NEGATIVE_INFINITY;
			const editorText = () => {
				try {
					return typeof ctx?.ui?.getEditorText === "function" ? ctx.ui.getEditorText() : "";
				} catch {
					return "";
				}
			};
			const editorEmpty = () => editorText().length === 0;
			// A picker opened by a command submitted during the wait: its Esc closes it, not the run.
			// A `choose` picker's Enter is the choice that replaces the session (Pi aborts the run
			// then); another picker's Enter makes its choice and closes it.
			let picker: "choose" | "picker" | undefined;
			try {
				const unsubscribe = subscribe.call(ctx?.ui, (data: string) => {
					if (typeof data !== "string") return undefined;
					if (isEnterKey(data)) {
						// The listener runs before the editor takes the key: the text is what Enter submits.
						if (picker === "choose") end("abort");
						else if (picker === "picker") picker = undefined;
						else {
							const text = editorText();
							const effect = submitEffect(text);
							if (effect === "stop") end("abort");
							else if (effect === "quit") end("quit");
							else if (effect === "choose" || effect === "picker") picker = effect;
							else if (text.trim() && !text.trim().startsWith("/")) this.submitted = true; // a message, not a command
						}
					} else if (isEscapeKey(data)) {
						let verdict: boolean | undefined;
						try {
							verdict = isStop();
						} catch {
							verdict = undefined;
						}
						if (picker) picker = undefined;
						else if (verdict !== false) end("esc"); // not one that closes a picker opened some other way (Ctrl+L)
					} else if (isCtrlC(data)) {
						const at = now();
						if (at - lastCtrlC < DOUBLE_CTRL_C_MS) end("quit");
						lastCtrlC = at;
					} else if (isCtrlD(data) && editorEmpty()) end("quit");
					return undefined; // never consumed: Pi handles the key as always
				});
				if (typeof unsubscribe === "function") this.cleanups.push(unsubscribe);
				watching = true;
			} catch {
				// no terminal to listen to: the process may still be watched
			}
		}
		if (proc) watching = this.watchProcess(proc, ctx, end) || watching;
		this.signal = watching ? controller.signal : undefined;
	}

	private watchProcess(proc: ProcessLike, ctx: TerminalCtx | undefined, end: (why: WaitEnd) => void): boolean {
		let watching = false;
		try {
			for (const name of QUIT_SIGNALS) {
				// Only where Pi handles the signal: with no handler, the signal ends the process as it should.
				if (proc.listenerCount(name) === 0) continue;
				const onSignal = () => end("quit");
				proc.on(name, onSignal);
				this.cleanups.push(() => proc.off(name, onSignal));
				watching = true;
			}
			let mode: unknown;
			try {
				mode = ctx?.mode;
			} catch {
				mode = undefined; // a stale context
			}
			const stdin = proc.stdin;
			if (mode === "rpc" && stdin) {
				if (stdin.readableEnded) end("quit");
				const onEnd = () => end("quit");
				stdin.on("end", onEnd);
				this.cleanups.push(() => stdin.off("end", onEnd));
				if (stdin.readableFlowing === true) {
					// Pi reads its commands as they come (its own 'data' listener): a second listener sees
					// the same chunks and changes nothing. A paused input is not resumed by us.
					const onData = eachLine((line) => {
						if (isRpcPrompt(line)) this.submitted = true;
						else if (isRpcAbort(line)) end("abort");
					});
					stdin.on("data", onData);
					this.cleanups.push(() => stdin.off("data", onData));
				}
				watching = true;
			}
		} catch {
			// a process without these hooks: what is watched so far stays watched
		}
		return watching;
	}

	/** Whether an Esc (or a quit key, a quit signal, an RPC abort) was seen. */
	get pressed(): boolean {
		return this.ended !== undefined;
	}

	/** Whether the wait ended because Pi is going away (no notice: Pi is going away). */
	get quitting(): boolean {
		return this.ended === "quit";
	}

	/**
	 * Whether a prompt was submitted during the wait before what ended it: Pi holds a prompt while a
	 * `session_start` handler waits, so an Esc (or RPC abort) then finds no run to stop, and the
	 * prompt it was meant for ran once the wait was over.
	 */
	get promptPending(): boolean {
		return this.submittedBeforeEnd;
	}

	/** What ended the wait, if anything did. */
	get cause(): WaitEnd | undefined {
		return this.ended;
	}

	dispose(): void {
		for (const cleanup of this.cleanups.splice(0)) {
			try {
				cleanup();
			} catch {
				// the UI is gone (Pi is shutting down): nothing left to unsubscribe from
			}
		}
	}
}

/** What telling the user's stop from an Esc some other part of Pi's terminal UI takes needs: Pi's
 * `TUI` (the factory of an extension's widget is handed it), typed loosely. */
export interface FocusView {
	getFocusedComponent?: () => unknown;
}

/**
 * Whether an Esc pressed now goes to Pi's interrupt (`app.interrupt`: stop the run, the compaction,
 * the retry going on) -- the user's stop -- or to something it closes. Pi's terminal UI hands a key
 * to the component that has the focus (after the extensions' terminal listeners, which is where this
 * is asked): only Pi's editor (the one component with app actions, `onAction`: Pi's own or an
 * extension's `CustomEditor`) hands Esc to the interrupt, and then only with its completion list shut
 * (open, Esc shuts it) and, with Pi idle, not in its bash mode (a `!command` typed: Esc clears the
 * editor). A picker (`/model`, `/settings`, `/resume`...), an extension's dialog or an overlay has
 * the focus while open and takes the Esc to close itself. `undefined` when it cannot be told (no
 * `TUI` seen, one without `getFocusedComponent`, or one where nothing has the focus: a TUI Pi
 * swapped out): the caller counts the key as a stop, as before.
 */
export function escIsAStop(view: FocusView | undefined, busy: () => boolean): boolean | undefined {
	let focused: any;
	try {
		if (typeof view?.getFocusedComponent !== "function") return undefined;
		focused = view.getFocusedComponent();
	} catch {
		return undefined;
	}
	// Nothing has the focus: a TUI Pi has swapped out (a change of its TUI mode in /settings), not the one
	// the key goes to -- not known.
	if (!focused || typeof focused !== "object") return undefined;
	if (typeof focused.onAction !== "function") return false; // not the editor: a picker, a dialog, an overlay
	try {
		if (typeof focused.isShowingAutocomplete === "function" && focused.isShowingAutocomplete()) return false;
		if (!busy() && typeof focused.getText === "function" && String(focused.getText()).trimStart().startsWith("!")) return false;
	} catch {
		return true; // the editor, whatever else it is doing
	}
	return true;
}

/**
 * Calls `onStop` at every Esc on the terminal (interactive mode) that is the user's stop
 * (`isStop`, {@link escIsAStop}: not one that closes a picker, a dialog or the editor's completion
 * list) and at every RPC `abort` line (RPC mode, a client's Esc) until {@link StopKeyWatch.dispose};
 * the key is never consumed. For what Pi's own Esc does not reach: pressed while Pi is idle, it
 * finds no run to stop -- while a cast's utility command runs, that said nothing at all (the caller
 * tells the user what does stop it). What it does not know: a rebound interrupt key (Esc is watched).
 */
export class StopKeyWatch {
	private readonly cleanups: Array<() => void> = [];

	constructor(ctx: TerminalCtx | undefined, onStop: (cause: "esc" | "abort") => void, proc?: ProcessLike,
		isStop: () => boolean | undefined = () => undefined) {
		const stop = (cause: "esc" | "abort") => {
			try {
				onStop(cause);
			} catch {
				// the caller's fault must not reach Pi's key handling
			}
		};
		const subscribe = ctx?.hasUI ? ctx.ui?.onTerminalInput : undefined;
		if (typeof subscribe === "function") {
			try {
				const unsubscribe = subscribe.call(ctx?.ui, (data: string) => {
					if (typeof data !== "string" || !isEscapeKey(data)) return undefined;
					let verdict: boolean | undefined;
					try {
						verdict = isStop();
					} catch {
						verdict = undefined;
					}
					if (verdict !== false) stop("esc"); // asked before Pi hands the key on: the focus is the key's
					return undefined; // never consumed
				});
				if (typeof unsubscribe === "function") this.cleanups.push(unsubscribe);
			} catch {
				// no terminal to listen to
			}
		}
		let mode: unknown;
		try {
			mode = ctx?.mode;
		} catch {
			mode = undefined;
		}
		const stdin = proc?.stdin;
		if (mode === "rpc" && stdin) {
			const onData = eachLine((line) => {
				if (rpcType(line) === "abort") stop("abort");
			});
			// Only once Pi reads its input: a 'data' listener would start a paused input flowing, and
			// at session_start Pi's RPC reader is not attached yet (it resumes the input after).
			let listening = false;
			const listen = () => {
				if (listening) return;
				listening = true;
				stdin.off("resume", listen);
				stdin.on("data", onData);
				this.cleanups.push(() => stdin.off("data", onData));
			};
			try {
				if (stdin.readableFlowing === true) listen();
				else {
					stdin.on("resume", listen);
					this.cleanups.push(() => stdin.off("resume", listen));
				}
			} catch {
				// an input without listeners: nothing watched there
			}
		}
	}

	dispose(): void {
		for (const cleanup of this.cleanups.splice(0)) {
			try {
				cleanup();
			} catch {
				// the UI is gone
			}
		}
	}
}
