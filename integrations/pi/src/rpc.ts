/**
 * A small msgpack-rpc peer over a byte stream pair (the castor child's stdin/stdout).
 *
 * Wire format (docs/protocol.md): request `[0, msgid, method, params]`, response
 * `[1, msgid, error, result]`, notification `[2, method, params]`. `params` is a
 * one-element array holding a map; `error` is nil or `{code, message, data?}`.
 * Both sides may send requests.
 *
 * Guarantees:
 * - every `request()` settles: with the result, with the peer's error (as RpcError),
 *   with `timeout` after its deadline, or with `runtime_exited` when the stream closes;
 * - a throwing or unknown handler answers the peer with an error map, never crashes Pi;
 * - frames after `close()` are dropped.
 */
import { Encoder, decodeMultiStream } from "@msgpack/msgpack";
import type { Readable, Writable } from "node:stream";

const REQUEST = 0;
const RESPONSE = 1;
const NOTIFICATION = 2;

export type Params = Record<string, unknown>;
export type Handler = (params: Params) => unknown | Promise<unknown>;

/** An error with the stable string `code` of the castor error model. */
export class RpcError extends Error {
	readonly code: string;
	readonly data: unknown;
	constructor(code: string, message: string, data?: unknown) {
		super(message);
		this.name = "RpcError";
		this.code = code;
		this.data = data;
	}
	toWire(): Record<string, unknown> {
		const wire: Record<string, unknown> = { code: this.code, message: this.message };
		if (this.data !== undefined) wire.data = this.data;
		return wire;
	}
}

/**
 * Why an entry castor asked to append must not be appended, or null to append it. castor sends
 * `expires_at_ms` (Unix ms, this host's clock) with an entry whose acknowledgement it waits for
 * only so long -- the Icarus filter audit, which must be in the session before castor injects the
 * filtered memory, and after which castor injects the unfiltered one. Past that instant castor has
 * already gone on without the entry, so appended it would say `filtered` for a context that went in
 * unfiltered: it is refused (`timeout`, `reason: expired`) and never appended. Absent or null:
 * appended whenever it comes. Anything else is `invalid_params`.
 */
export function entryRefusal(expiresAtMs: unknown, nowMs: number): RpcError | null {
	if (expiresAtMs === undefined || expiresAtMs === null) return null;
	if (typeof expiresAtMs !== "number" || !Number.isFinite(expiresAtMs)) {
		return new RpcError("invalid_params", "expires_at_ms must be a number (Unix milliseconds)");
	}
	if (nowMs <= expiresAtMs) return null;
	const lateMs = Math.round(nowMs - expiresAtMs);
	return new RpcError("timeout", `entry not appended: it came ${lateMs} ms after its expiry (expires_at_ms)`,
		{ reason: "expired", late_ms: lateMs });
}

interface Pending {
	resolve: (value: unknown) => void;
	reject: (error: RpcError) => void;
	timer: ReturnType<typeof setTimeout>;
	method: string;
}

/** Unwrap the one-element params array; tolerate a bare map; anything else is an empty map. */
export function unwrapParams(raw: unknown): Params {
	const value = Array.isArray(raw) ? (raw.length === 1 ? raw[0] : {}) : raw;
	return value !== null && typeof value === "object" && !Array.isArray(value) ? (value as Params) : {};
}

function toRpcError(error: unknown): RpcError {
	if (error instanceof RpcError) return error;
	if (error !== null && typeof error === "object") {
		const e = error as Record<string, unknown>;
		if (typeof e.code === "string" && typeof e.message === "string") return new RpcError(e.code, e.message, e.data);
		if (error instanceof Error) return new RpcError("internal", error.message);
	}
	return new RpcError("internal", String(error));
}

/** castor reads no string longer than this (UTF-8 bytes) and no frame larger than twice it: one
 * over either closes the connection. */
export const MAX_WIRE_STRING_BYTES = 8 * 1024 * 1024;

/**
 * Why `value` would be over what castor reads (a string over 8 MiB, or more than 16 MiB of text in
 * all), or undefined. Strings are measured in UTF-8 only where their length could be over (a
 * string of n UTF-16 units takes at most 3n bytes).
 */
export function oversize(value: unknown): string | undefined {
	let total = 0;
	const visit = (v: unknown, depth: number): string | undefined => {
		if (typeof v === "string") {
			const bytes = v.length * 3 > MAX_WIRE_STRING_BYTES ? Buffer.byteLength(v, "utf8") : v.length;
			total += bytes;
			if (bytes > MAX_WIRE_STRING_BYTES) return `a text of ${(bytes / 1048576).toFixed(1)} MiB is over the 8 MiB castor reads`;
			if (total > 2 * MAX_WIRE_STRING_BYTES) return "more than 16 MiB of text in one message is over what castor reads";
			return undefined;
		}
		if (v === null || typeof v !== "object" || depth > 64) return undefined;
		for (const item of Array.isArray(v) ? v : Object.values(v as Record<string, unknown>)) {
			const found = visit(item, depth + 1);
			if (found) return found;
		}
		return undefined;
	};
	return visit(value, 0);
}

export class MsgpackRpcPeer {
	private nextId = 1;
	private readonly pending = new Map<number, Pending>();
	private readonly handlers = new Map<string, Handler>();
	private readonly encoder = new Encoder({ ignoreUndefined: true });
	private closed = false;
	private closeReason = "connection closed";
	private readonly closeListeners: Array<(reason: string) => void> = [];
	private readonly silenceListeners: Array<(silent: boolean) => void> = [];
	/** How many frames have come from the peer (a count, not a time: two events in one millisecond
	 * are still told apart). */
	private framesHeard = 0;
	/** Set when a request's deadline passed with nothing heard from the peer since it was sent (a
	 * stopped or wedged process); cleared by the next frame that arrives. */
	private silentSince: number | undefined;
	private readonly input: Readable;
	private readonly output: Writable;
	private readonly log: (msg: string) => void;

	constructor(input: Readable, output: Writable, log: (msg: string) => void = () => {}) {
		this.input = input;
		this.output = output;
		this.log = log;
		output.on("error", (err) => this.close(`write failed: ${err.message}`));
		void this.readLoop();
	}

	get isClosed(): boolean {
		return this.closed;
	}

	/** Whether the peer went silent: a deadline passed with nothing heard since the request was sent. */
	get silent(): boolean {
		return this.silentSince !== undefined;
	}

	/** Told `true` when the peer goes silent, `false` when a frame comes from it again. */
	onSilence(listener: (silent: boolean) => void): void {
		this.silenceListeners.push(listener);
	}

	private setSilent(silent: boolean): void {
		if (silent === this.silent) return;
		this.silentSince = silent ? Date.now() : undefined;
		for (const listener of this.silenceListeners) {
			try {
				listener(silent);
			} catch (err) {
				this.log(`silence listener failed: ${String(err)}`);
			}
		}
	}

	/** Register a handler for requests and notifications named `method`. */
	on(method: string, handler: Handler): void {
		this.handlers.set(method, handler);
	}

	onClose(listener: (reason: string) => void): void {
		this.closeListeners.push(listener);
	}

	/** Send a request; settles within `timeoutMs` whatever the peer does. One larger than castor
	 * reads (`oversize`) is refused here, `invalid_params`, and the connection stays up. Its
	 * deadline passing with nothing heard makes the peer silent, unless `marksSilence` is false:
	 * a quick best-effort ask whose short deadline a busy (not stopped) castor may miss. */
	request(method: string, params: Params, timeoutMs: number, { marksSilence = true }: { marksSilence?: boolean } = {}): Promise<unknown> {
		if (this.closed) return Promise.reject(new RpcError("runtime_exited", `castor runtime is not running (${this.closeReason})`));
		const msgid = this.nextId++;
		const bytes = this.encodeFrame([REQUEST, msgid, method, [params]]);
		if (typeof bytes === "string") return Promise.reject(new RpcError("invalid_params", `${method} not sent: ${bytes}`));
		const heardBefore = this.framesHeard;
		return new Promise((resolve, reject) => {
			const timer = setTimeout(() => {
				this.pending.delete(msgid);
				if (marksSilence && this.framesHeard === heardBefore) this.setSilent(true); // not one frame since: stopped, not slow
				reject(new RpcError("timeout", `castor did not answer ${method} within ${timeoutMs} ms`));
			}, timeoutMs);
			this.pending.set(msgid, { resolve, reject, timer, method });
			this.send(bytes);
		});
	}

	notify(method: string, params: Params): void {
		if (!this.closed) this.write([NOTIFICATION, method, [params]], `${method} not sent`);
	}

	/** Reject everything in flight and stop reading; idempotent. */
	close(reason: string): void {
		if (this.closed) return;
		this.closed = true;
		this.closeReason = reason;
		for (const [msgid, p] of this.pending) {
			clearTimeout(p.timer);
			p.reject(new RpcError("runtime_exited", `castor runtime exited during ${p.method} (${reason})`));
			this.pending.delete(msgid);
		}
		for (const listener of this.closeListeners) {
			try {
				listener(reason);
			} catch (err) {
				this.log(`close listener failed: ${String(err)}`);
			}
		}
	}

	/**
	 * The frame's bytes, or why it is not sent: not encodable, or over what castor reads. Only a
	 * frame over 8 MiB is looked into (`oversize`): under it no string can be over, so the calls of
	 * every turn pay nothing for the check.
	 */
	private encodeFrame(frame: unknown[]): Uint8Array | string {
		let bytes: Uint8Array;
		try {
			bytes = this.encoder.encode(frame);
		} catch (err) {
			return `cannot encode the ${String(frame[0])} frame: ${String(err)}`;
		}
		if (bytes.length > 2 * MAX_WIRE_STRING_BYTES) return `a message of ${(bytes.length / 1048576).toFixed(1)} MiB is over the 16 MiB castor reads`;
		if (bytes.length > MAX_WIRE_STRING_BYTES) return oversize(frame) ?? bytes;
		return bytes;
	}

	private send(bytes: Uint8Array): void {
		try {
			this.output.write(bytes);
		} catch (err) {
			this.log(`write failed: ${String(err)}`); // the stream's "error" event closes the peer
		}
	}

	/** Encode and send `frame`; one that cannot go is logged (`what` names it), never sent. */
	private write(frame: unknown[], what = "frame not sent"): void {
		const bytes = this.encodeFrame(frame);
		if (typeof bytes === "string") this.log(`${what}: ${bytes}`);
		else this.send(bytes);
	}

	private async readLoop(): Promise<void> {
		try {
			for await (const frame of decodeMultiStream(this.input as unknown as AsyncIterable<Uint8Array>)) {
				if (this.closed) break;
				this.dispatch(frame);
			}
			this.close("stream ended");
		} catch (err) {
			// A frame we cannot decode means the stream cannot be resynchronised: treat as closed.
			this.close(`undecodable stream: ${err instanceof Error ? err.message : String(err)}`);
		}
	}

	private dispatch(frame: unknown): void {
		this.framesHeard++;
		if (this.silentSince !== undefined) this.setSilent(false);
		if (!Array.isArray(frame) || frame.length < 3) {
			this.log(`ignoring malformed frame`);
			return;
		}
		const kind = frame[0];
		if (kind === RESPONSE && frame.length === 4) {
			const p = this.pending.get(frame[1] as number);
			if (!p) return; // late answer after a timeout: nothing waits for it any more
			this.pending.delete(frame[1] as number);
			clearTimeout(p.timer);
			if (frame[2] !== null && frame[2] !== undefined) p.reject(toRpcError(frame[2]));
			else p.resolve(frame[3]);
		} else if (kind === REQUEST && frame.length === 4) {
			void this.answer(frame[1] as number, String(frame[2]), unwrapParams(frame[3]));
		} else if (kind === NOTIFICATION) {
			const handler = this.handlers.get(String(frame[1]));
			if (!handler) {
				this.log(`unhandled notification ${String(frame[1])}`);
				return;
			}
			Promise.resolve()
				.then(() => handler(unwrapParams(frame[2])))
				.catch((err) => this.log(`notification ${String(frame[1])} failed: ${String(err)}`));
		} else {
			this.log(`ignoring frame of kind ${String(kind)}`);
		}
	}

	private async answer(msgid: number, method: string, params: Params): Promise<void> {
		const handler = this.handlers.get(method);
		if (!handler) {
			this.write([RESPONSE, msgid, { code: "unknown_method", message: `harness has no method ${method}` }, null]);
			return;
		}
		try {
			const result = await handler(params);
			const bytes = this.encodeFrame([RESPONSE, msgid, null, result ?? null]);
			if (typeof bytes === "string") throw new RpcError("invalid_params", `the answer to ${method} is not sent: ${bytes}`);
			this.send(bytes);
		} catch (err) {
			this.write([RESPONSE, msgid, toRpcError(err).toWire(), null]);
		}
	}
}

/**
 * `work`, or a rejection as soon as `signal` aborts (the user's Esc during a Fabric tool call):
 * Pi's run ends at once instead of waiting for the tool. castor's call itself runs on (the
 * protocol has no cancel for it): its answer is dropped, and what it did (a write) stands.
 */
export function untilAborted<T>(work: Promise<T>, signal: AbortSignal | undefined): Promise<T> {
	if (!signal) return work;
	if (signal.aborted) return Promise.reject(new Error("aborted"));
	return new Promise<T>((resolve, reject) => {
		const onAbort = () => reject(new Error("aborted"));
		signal.addEventListener("abort", onAbort, { once: true });
		work.then(
			(value) => {
				signal.removeEventListener("abort", onAbort);
				resolve(value);
			},
			(err) => {
				signal.removeEventListener("abort", onAbort);
				reject(err);
			},
		);
	});
}
