import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { chmodSync, mkdtempSync, writeFileSync } from "node:fs";
import { createServer, connect, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { ipHex, ownerInTables, ownerIsUs, procEndpoint, tcpListenerOwner, unixListenerOwner } from "../src/owner.ts";
import type { Endpoint } from "../src/locate.ts";
import { RpcError } from "../src/rpc.ts";
import { CastorRuntime } from "../src/runtime.ts";

const LOOP4 = "00000000000000000000ffff7f000001";

test("ipHex: IPv4, IPv6, IPv4-mapped and scoped addresses as one 16-byte form; junk is undefined", () => {
	assert.equal(ipHex("127.0.0.1"), LOOP4);
	assert.equal(ipHex("::ffff:127.0.0.1"), LOOP4);
	assert.equal(ipHex("::1"), "00000000000000000000000000000001");
	assert.equal(ipHex("fe80::1%eth0"), "fe800000000000000000000000000001");
	assert.equal(ipHex("2001:db8:0:0:0:0:2:1"), ipHex("2001:db8::2:1"));
	for (const bad of ["", "1.2.3", "256.0.0.1", "1::2::3", "1:2:3:4:5:6:7:8:9", "localhost", "::g"]) assert.equal(ipHex(bad), undefined, bad);
});

test("procEndpoint: /proc/net/tcp's words in host byte order, IPv4 and IPv6", () => {
	assert.deepEqual(procEndpoint("0100007F:1E61", true), { ip: LOOP4, port: 7777 });
	assert.deepEqual(procEndpoint("7F000001:1E61", false), { ip: LOOP4, port: 7777 });
	assert.deepEqual(procEndpoint("00000000000000000000000001000000:0050", true), { ip: ipHex("::1"), port: 80 });
	assert.deepEqual(procEndpoint("0000000000000000FFFF00000100007F:0050", true), { ip: LOOP4, port: 80 });
	assert.equal(procEndpoint("nothex:0050", true), undefined);
});

test("ownerInTables: the row from the listener's side, with its uid; none is undefined", () => {
	const table = [
		"  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode",
		"   0: 0100007F:1E61 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1001        0 1 1 0",
		"   1: 0100007F:1E61 0100007F:A000 01 00000000:00000000 00:00000000 00000000  1001        0 2 1 0",
		"   2: 0100007F:A000 0100007F:1E61 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0",
	].join("\n");
	const listener = { ip: LOOP4, port: 0x1e61 };
	const us = { ip: LOOP4, port: 0xa000 };
	assert.equal(ownerInTables([table], listener, us, true), 1001);
	assert.equal(ownerInTables([table], us, listener, true), 0);
	assert.equal(ownerInTables([table], listener, { ip: LOOP4, port: 1 }, true), undefined);
	assert.deepEqual(tcpListenerOwner({ localAddress: "127.0.0.1", localPort: 0xa000, remoteAddress: "127.0.0.1", remotePort: 0x1e61 }, () => undefined), undefined);
});

test("ownerIsUs: this user or root; another uid or a listener gone is not; no table to ask is", () => {
	assert.equal(ownerIsUs({ uid: 1000 }, 1000), true);
	assert.equal(ownerIsUs({ uid: 0 }, 1000), true);
	assert.equal(ownerIsUs({ uid: 1001 }, 1000), false);
	assert.equal(ownerIsUs({ gone: true }, 1000), false);
	assert.equal(ownerIsUs(undefined, 1000), true);
	assert.deepEqual(unixListenerOwner(join(tmpdir(), "castor-no-such-socket")), { gone: true });
});

test("a TCP connection to this process's own listener names this user", { skip: process.platform !== "linux" }, async () => {
	const server = createServer((s) => s.destroy());
	await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
	const port = (server.address() as { port: number }).port;
	const socket: Socket = connect({ host: "127.0.0.1", port });
	await new Promise((r) => socket.once("connect", r));
	try {
		let owner = tcpListenerOwner(socket);
		for (let i = 0; i < 40 && owner !== undefined && "gone" in owner; i++) {
			await new Promise((r) => setTimeout(r, 5));
			owner = tcpListenerOwner(socket);
		}
		assert.deepEqual(owner, { uid: process.getuid!() });
	} finally {
		socket.destroy();
		server.close();
	}
});

const asRoot = process.platform === "linux" && process.getuid?.() === 0;

/** The extension's runtime connecting to `endpoint` (nothing spawned), quiet. */
function runtimeAt(endpoint: Endpoint, cwd: string, tokenFile?: string): CastorRuntime {
	return new CastorRuntime({
		command: [],
		endpoint,
		tokenFile,
		cwd,
		timeoutMs: 5_000,
		helloParams: { client: "owner-test" },
		handlers: {},
		log: () => {},
		onUp: () => {},
		onDown: () => {},
	});
}

test("the extension never sends its token to a port another user listens on (forbidden, nothing heard)", { skip: !asRoot, timeout: 20_000 }, async () => {
	// Another user (nobody) takes the loopback port castor's serve uses while it is down, and
	// reports every byte a peer sends. Before, the extension's hello carried the token to it.
	const listener = spawn(process.execPath, ["-e", `
		const net = require("node:net");
		const server = net.createServer((s) => s.on("data", (d) => process.stdout.write("HEARD " + d.toString("hex") + "\\n")));
		server.listen(0, "127.0.0.1", () => process.stdout.write("PORT " + server.address().port + "\\n"));
	`], { uid: 65534, gid: 65534, stdio: ["ignore", "pipe", "inherit"] });
	let out = "";
	listener.stdout!.setEncoding("utf8");
	listener.stdout!.on("data", (t: string) => (out += t));
	try {
		while (!/PORT \d+/.test(out)) await new Promise((r) => setTimeout(r, 10));
		const port = Number(/PORT (\d+)/.exec(out)![1]);
		const dir = mkdtempSync(join(tmpdir(), "castor-owner-"));
		const tokenFile = join(dir, "token");
		writeFileSync(tokenFile, "s3cret-token-that-must-stay-home\n");
		chmodSync(tokenFile, 0o600);
		const runtime = runtimeAt({ kind: "tcp", host: "127.0.0.1", port }, dir, tokenFile);
		await assert.rejects(runtime.ensure(), (err: unknown) => err instanceof RpcError && err.code === "forbidden" && /uid 65534/.test(err.message));
		// Ask the listener what it heard: a probe of our own, then its report.
		const probe = connect({ host: "127.0.0.1", port });
		await new Promise((r) => probe.once("connect", r));
		probe.end("END");
		while (!out.includes(Buffer.from("END").toString("hex"))) await new Promise((r) => setTimeout(r, 10));
		assert.ok(!out.includes(Buffer.from("s3cret").toString("hex")), out);
		assert.equal(out.match(/HEARD/g)?.length, 1, out);
	} finally {
		listener.kill("SIGKILL");
	}
});

test("nor to a Unix socket another user planted at the endpoint's path", { skip: !asRoot, timeout: 20_000 }, async () => {
	const dir = mkdtempSync(join(tmpdir(), "castor-owner-"));
	chmodSync(dir, 0o777); // a shared directory: anyone may plant a socket there
	const path = join(dir, "castor.sock");
	const listener = spawn(process.execPath, ["-e", `
		const net = require("node:net");
		const server = net.createServer((s) => s.on("data", (d) => process.stdout.write("HEARD " + d.toString("hex") + "\\n")));
		server.listen(${JSON.stringify(path)}, () => process.stdout.write("LISTENING\\n"));
	`], { uid: 65534, gid: 65534, stdio: ["ignore", "pipe", "inherit"] });
	let out = "";
	listener.stdout!.setEncoding("utf8");
	listener.stdout!.on("data", (t: string) => (out += t));
	try {
		while (!out.includes("LISTENING")) await new Promise((r) => setTimeout(r, 10));
		const runtime = runtimeAt({ kind: "unix", path }, dir);
		await assert.rejects(runtime.ensure(), (err: unknown) => err instanceof RpcError && err.code === "forbidden" && /uid 65534/.test(err.message));
		assert.ok(!out.includes("HEARD"), out);
	} finally {
		listener.kill("SIGKILL");
	}
});
