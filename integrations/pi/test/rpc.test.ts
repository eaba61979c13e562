import assert from "node:assert/strict";
import { PassThrough } from "node:stream";
import { test } from "node:test";
import { Encoder } from "@msgpack/msgpack";
import { entryRefusal, MsgpackRpcPeer, RpcError } from "../src/rpc.ts";

/** A peer whose other end is this test: `toPeer` carries frames to it, `fromPeer` what it writes. */
function pair(): { peer: MsgpackRpcPeer; send: (frame: unknown[]) => void; close: () => void } {
	const toPeer = new PassThrough();
	const fromPeer = new PassThrough();
	fromPeer.resume(); // what the peer writes is not read here
	const peer = new MsgpackRpcPeer(toPeer, fromPeer);
	const encoder = new Encoder();
	return { peer, send: (frame) => toPeer.write(encoder.encode(frame)), close: () => peer.close("test over") };
}

test("a deadline passed with nothing heard since the request makes the peer silent, until a frame comes", async () => {
	const { peer, send, close } = pair();
	const heard: boolean[] = [];
	peer.onSilence((silent) => heard.push(silent));
	await assert.rejects(peer.request("harness.event", {}, 30), (err: unknown) => err instanceof RpcError && err.code === "timeout");
	assert.equal(peer.silent, true);
	assert.deepEqual(heard, [true]);
	send([2, "ui.status", [{ key: "x" }]]); // anything from castor: it is not stopped
	await new Promise((r) => setTimeout(r, 20));
	assert.equal(peer.silent, false);
	assert.deepEqual(heard, [true, false]);
	close();
});

test("a best-effort request (marksSilence false) that times out leaves the peer not silent", async () => {
	// The cast-id refresh asks on a 2 s deadline: a castor busy past it (a loaded machine) was
	// marked not answering, and the next command then failed after a probe instead of asking.
	const { peer, close } = pair();
	const heard: boolean[] = [];
	peer.onSilence((silent) => heard.push(silent));
	await assert.rejects(peer.request("cast.list", {}, 30, { marksSilence: false }),
		(err: unknown) => err instanceof RpcError && err.code === "timeout");
	assert.equal(peer.silent, false);
	assert.deepEqual(heard, []);
	close();
});

test("a slow answer while the peer keeps talking is a timeout, not silence", async () => {
	const { peer, send, close } = pair();
	const pending = peer.request("harness.event", {}, 60);
	setTimeout(() => send([2, "ui.status", [{ key: "x" }]]), 10); // heard after the request was sent
	await assert.rejects(pending, (err: unknown) => err instanceof RpcError && err.code === "timeout");
	assert.equal(peer.silent, false);
	close();
});

test("entryRefusal: an entry past its expires_at_ms is refused (timeout, expired); absent or in time, appended", () => {
	assert.equal(entryRefusal(undefined, 5000), null);
	assert.equal(entryRefusal(null, 5000), null);
	assert.equal(entryRefusal(5000, 5000), null);
	assert.equal(entryRefusal(9000, 5000), null);
	const late = entryRefusal(4000, 5250);
	assert.ok(late instanceof RpcError);
	assert.equal(late.code, "timeout");
	assert.deepEqual(late.data, { reason: "expired", late_ms: 1250 });
	assert.match(late.message, /1250 ms after its expiry/);
	for (const bad of ["4000", Number.NaN, Infinity, {}]) assert.equal(entryRefusal(bad, 5000)?.code, "invalid_params");
});
