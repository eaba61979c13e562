/**
 * `model.list`: Pi's model registry as castor's Icarus classifier reads it (docs/icarus.md,
 * "Model selection").
 *
 * | Pi has | castor gets |
 * |---|---|
 * | `modelRegistry.getAll()` | `{models: [{provider, id, name, api, base_url, available, context_window, reasoning}], current}`; `available` from `getAvailable()` (every model when Pi has no such call) |
 * | no registry, or one without `getAll` (an older Pi) | error `unsupported`: castor keeps the retrieved context unfiltered and audits `no_registry` (an empty list would read as "no usable model", `no_model`) |
 */
import { RpcError } from "./rpc.ts";

export function listModels(registry: any, current: any): { models: Record<string, unknown>[]; current: { provider: unknown; id: unknown } | null } {
	if (typeof registry?.getAll !== "function") throw new RpcError("unsupported", "this Pi has no model registry (modelRegistry.getAll)");
	const all: any[] = registry.getAll();
	const available = new Set<any>(typeof registry.getAvailable === "function" ? registry.getAvailable() : all);
	return {
		models: all.map((m) => ({
			provider: m.provider,
			id: m.id,
			name: m.name ?? m.id,
			api: m.api ?? null,
			base_url: m.baseUrl ?? null,
			available: available.has(m),
			context_window: m.contextWindow ?? null,
			reasoning: m.reasoning === true,
		})),
		current: current ? { provider: current.provider, id: current.id } : null,
	};
}
