/**
 * Fabric tools announced by castor (`runtime.hello`, `session.open` or `icarus.config`
 * results, key `tools`), registered with Pi and forwarded as `icarus.tool`.
 *
 * Tool spec on the wire: `{name, description, parameters (JSON schema), label?,
 * prompt_snippet?, prompt_guidelines?}`.
 *
 * Result translation (docs/icarus.md, 'Tools'): the value castor returns becomes
 * `{content:[{type:"text", text: JSON (2-space)}], details: value}`; an object value with
 * an `error` key adds `isError: true`. Transport failures (timeout, dead runtime, an
 * error response) are thrown so Pi marks the call failed; they are never retried.
 * A tool already registered under the same name is not registered again.
 */
import type { ExtensionAPI, ToolDefinition } from "@mariozechner/pi-coding-agent";
import * as typebox from "typebox";

export interface ToolSpec {
	name: string;
	description?: string;
	label?: string;
	parameters?: Record<string, unknown>;
	prompt_snippet?: string;
	prompt_guidelines?: string[];
}

export type ToolCaller = (name: string, params: Record<string, unknown>, toolCallId: string, signal?: AbortSignal) => Promise<unknown>;

type ToolHost = Pick<ExtensionAPI, "registerTool">;

export function toolSpecs(result: unknown): ToolSpec[] {
	const tools = (result as { tools?: unknown } | null | undefined)?.tools;
	if (!Array.isArray(tools)) return [];
	return tools.filter((t): t is ToolSpec => t !== null && typeof t === "object" && typeof (t as ToolSpec).name === "string" && /^[A-Za-z0-9_-]{1,64}$/.test((t as ToolSpec).name));
}

export function toolResult(value: unknown): { content: { type: "text"; text: string }[]; details: unknown; isError?: boolean } {
	const text = JSON.stringify(value ?? null, null, 2);
	const out: { content: { type: "text"; text: string }[]; details: unknown; isError?: boolean } = { content: [{ type: "text", text }], details: value };
	if (value !== null && typeof value === "object" && !Array.isArray(value) && "error" in value) out.isError = true;
	return out;
}

export class FabricTools {
	private readonly registered = new Set<string>();

	private readonly pi: ToolHost;
	private readonly call: ToolCaller;

	constructor(pi: ToolHost, call: ToolCaller) {
		this.pi = pi;
		this.call = call;
	}

	get names(): string[] {
		return [...this.registered];
	}

	/** Register every new spec in `result.tools`; returns the names registered now. */
	registerFrom(result: unknown): string[] {
		const added: string[] = [];
		for (const spec of toolSpecs(result)) {
			if (this.registered.has(spec.name)) continue;
			const schema = spec.parameters && typeof spec.parameters === "object" ? spec.parameters : { type: "object", properties: {}, additionalProperties: true };
			const call = this.call;
			const tool: ToolDefinition = {
				name: spec.name,
				label: spec.label ?? spec.name,
				description: spec.description ?? spec.name,
				parameters: typebox.Type.Unsafe(schema as never),
				async execute(toolCallId: string, params: unknown, signal: AbortSignal | undefined) {
					const value = await call(spec.name, (params ?? {}) as Record<string, unknown>, toolCallId, signal);
					return toolResult(value);
				},
			};
			if (spec.prompt_snippet) tool.promptSnippet = spec.prompt_snippet;
			if (Array.isArray(spec.prompt_guidelines)) tool.promptGuidelines = spec.prompt_guidelines;
			this.pi.registerTool(tool);
			this.registered.add(spec.name);
			added.push(spec.name);
		}
		return added;
	}
}
