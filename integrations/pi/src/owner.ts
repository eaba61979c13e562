/**
 * Who listens at the other end of a connection to castor's endpoint, before anything is sent.
 *
 * A loopback port is anyone's to take while castor's serve is down, and a socket path in a shared
 * directory is anyone's to plant: whoever listens there would hear the endpoint's token in the
 * hello, and then every prompt, memory and tool call of the session. castor's own Python client
 * asks the kernel (`SO_PEERCRED`, `/proc/net/tcp`); Node has no peer-credential call, so:
 *
 * - TCP: Linux lists every TCP socket of the network namespace with its owner's uid in
 *   `/proc/net/tcp` and `/proc/net/tcp6` (readable by every user); the listener's side of our
 *   connection is the row whose local address is our peer and whose remote address is us.
 * - Unix socket: the socket file's owner (castor's serve makes the file; a planted one is its
 *   planter's).
 *
 * Guarantees: `listenerOwner` never throws; it answers `undefined` only where the platform keeps no
 * such table (not Linux). Not guaranteed: a Unix socket file replaced between the check and the
 * connect (castor's serve keeps its socket in a directory only its user may write).
 */
import { lstatSync, readFileSync } from "node:fs";
import { endianness } from "node:os";

const PROC_TABLES = ["/proc/net/tcp", "/proc/net/tcp6"];

/** An address as 16 bytes (IPv4 as IPv4-mapped IPv6) in hex, and a port. */
export interface Endpoint16 {
	ip: string;
	port: number;
}

/** `127.0.0.1`, `::1`, `::ffff:127.0.0.1`, `fe80::1%eth0` as 32 hex digits (IPv4 mapped), or undefined. */
export function ipHex(text: string): string | undefined {
	const address = text.split("%", 1)[0]!.toLowerCase();
	const v4 = (dotted: string): string | undefined => {
		const parts = dotted.split(".");
		if (parts.length !== 4 || !parts.every((p) => /^\d{1,3}$/.test(p) && Number(p) < 256)) return undefined;
		return parts.map((p) => Number(p).toString(16).padStart(2, "0")).join("");
	};
	if (!address.includes(":")) {
		const hex = v4(address);
		return hex === undefined ? undefined : `00000000000000000000ffff${hex}`;
	}
	let words: string[] = [];
	let tail = address;
	const lastColon = tail.lastIndexOf(":");
	if (tail.slice(lastColon + 1).includes(".")) {
		const hex = v4(tail.slice(lastColon + 1));
		if (hex === undefined) return undefined;
		tail = `${tail.slice(0, lastColon + 1)}${hex.slice(0, 4)}:${hex.slice(4)}`;
	}
	const halves = tail.split("::");
	if (halves.length > 2) return undefined;
	const split = (part: string) => (part === "" ? [] : part.split(":"));
	const head = split(halves[0]!);
	const rest = halves.length === 2 ? split(halves[1]!) : [];
	const missing = 8 - head.length - rest.length;
	if (halves.length === 2 ? missing < 1 : missing !== 0) return undefined;
	words = [...head, ...Array<string>(halves.length === 2 ? missing : 0).fill("0"), ...rest];
	if (!words.every((w) => /^[0-9a-f]{1,4}$/.test(w))) return undefined;
	return words.map((w) => w.padStart(4, "0")).join("");
}

/**
 * `0100007F:1E61` (a row's address in `/proc/net/tcp`: 32-bit words printed in the host's byte
 * order) as an {@link Endpoint16}.
 */
export function procEndpoint(field: string, littleEndian = endianness() === "LE"): Endpoint16 | undefined {
	const [hexIp, hexPort] = field.split(":");
	if (!hexIp || !hexPort || !/^[0-9A-Fa-f]+$/.test(hexIp) || (hexIp.length !== 8 && hexIp.length !== 32)) return undefined;
	let bytes = "";
	for (let i = 0; i < hexIp.length; i += 8) {
		const word = hexIp.slice(i, i + 8).toLowerCase();
		bytes += littleEndian ? word.match(/../g)!.reverse().join("") : word;
	}
	const ip = bytes.length === 8 ? `00000000000000000000ffff${bytes}` : bytes;
	const port = Number.parseInt(hexPort, 16);
	return Number.isNaN(port) ? undefined : { ip, port };
}

/** The uid of the row `local -> remote` in the text of `/proc/net/tcp` tables, or undefined. */
export function ownerInTables(tables: string[], local: Endpoint16, remote: Endpoint16, littleEndian?: boolean): number | undefined {
	for (const table of tables) {
		for (const line of table.split("\n").slice(1)) {
			const fields = line.trim().split(/\s+/);
			if (fields.length < 8) continue;
			const from = procEndpoint(fields[1]!, littleEndian);
			const to = procEndpoint(fields[2]!, littleEndian);
			if (from && to && from.ip === local.ip && from.port === local.port && to.ip === remote.ip && to.port === remote.port) {
				const uid = Number(fields[7]);
				if (Number.isInteger(uid)) return uid;
			}
		}
	}
	return undefined;
}

/** What a connected socket tells of its two ends (Node's `Socket` has these). */
export interface SocketEnds {
	localAddress?: string;
	localPort?: number;
	remoteAddress?: string;
	remotePort?: number;
}

export type ListenerOwner = { uid: number } | { gone: true } | undefined;

/**
 * The uid of the listener at the other end of a TCP connection: `{gone}` when no row names it (it
 * went away: nobody to talk to), `undefined` where the platform keeps no table.
 */
export function tcpListenerOwner(socket: SocketEnds, readTable: (file: string) => string | undefined = readProc): ListenerOwner {
	const ours = ipHex(socket.localAddress ?? "");
	const theirs = ipHex(socket.remoteAddress ?? "");
	if (ours === undefined || theirs === undefined || socket.localPort === undefined || socket.remotePort === undefined) {
		return { gone: true };
	}
	const tables = PROC_TABLES.map(readTable).filter((t): t is string => t !== undefined);
	if (tables.length === 0) return undefined;
	const uid = ownerInTables(tables, { ip: theirs, port: socket.remotePort }, { ip: ours, port: socket.localPort });
	return uid === undefined ? { gone: true } : { uid };
}

/** The owner of the Unix socket file at `path` (`{gone}` when there is none). */
export function unixListenerOwner(path: string): ListenerOwner {
	try {
		return { uid: lstatSync(path).uid };
	} catch {
		return { gone: true };
	}
}

/** Whether `owner` may hear this user's session: this user, or root. */
export function ownerIsUs(owner: ListenerOwner, myUid: number | undefined = process.getuid?.()): boolean {
	if (owner === undefined || myUid === undefined) return true; // no table to ask (not Linux)
	if ("gone" in owner) return false;
	return owner.uid === myUid || owner.uid === 0;
}

function readProc(file: string): string | undefined {
	try {
		return readFileSync(file, "latin1");
	} catch {
		return undefined;
	}
}
