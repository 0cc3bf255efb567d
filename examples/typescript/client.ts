// A client of mcp-write-gateway written with the official TypeScript SDK (docs/clients.md).
//
// It starts the gateway over stdio with the token in MCP_GATEWAY_TOKEN (the policy's
// `auth.env_token: true`: the SDK's callTool has no place for `params.auth`), lists the tools,
// answers the consent question the gateway asks through elicitation, and calls run_pytest with a
// progress callback that also resets the request's timeout, so a person taking longer than the
// SDK's 60 s default to answer, or a long suite, does not end the call. It prints one JSON
// document on stdout: the tools, each progress notification, and the result.
//
//   npm ci && npm run build
//   MCP_GATEWAY_TOKEN=$(mcp-gateway token issue alice) \
//     node dist/client.js [--test-path tests] [--answer allow_once] [--answer-after-s N] \
//       [--timeout-ms MS] -- mcp-gateway serve
//
// Without --answer, the question is shown on stderr and the answer read from the terminal.

import { createInterface } from "node:readline/promises";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport, getDefaultEnvironment } from "@modelcontextprotocol/sdk/client/stdio.js";
import { ElicitRequestSchema, type ElicitResult, type Progress } from "@modelcontextprotocol/sdk/types.js";

interface Options {
  testPath: string;
  answer?: string;
  answerAfterS: number;
  timeoutMs: number;
  command: string[];
}

function parseOptions(argv: string[]): Options {
  const split = argv.indexOf("--");
  const flags = split < 0 ? argv : argv.slice(0, split);
  const command = split < 0 ? ["mcp-gateway", "serve"] : argv.slice(split + 1);
  const value = (name: string): string | undefined => {
    const at = flags.indexOf(name);
    return at < 0 ? undefined : flags[at + 1];
  };
  return {
    testPath: value("--test-path") ?? "tests",
    answer: value("--answer"),
    answerAfterS: Number(value("--answer-after-s") ?? "0"),
    timeoutMs: Number(value("--timeout-ms") ?? "60000"),
    command,
  };
}

async function askThePerson(message: string, choices: string[]): Promise<string> {
  const terminal = createInterface({ input: process.stdin, output: process.stderr });
  try {
    const answer = await terminal.question(`${message}\nAnswer (${choices.join(", ")}): `);
    return answer.trim();
  } finally {
    terminal.close();
  }
}

async function main(): Promise<void> {
  const options = parseOptions(process.argv.slice(2));
  const token = process.env.MCP_GATEWAY_TOKEN;
  if (!token) {
    throw new Error("set MCP_GATEWAY_TOKEN (mcp-gateway token issue NAME) and auth.env_token: true in the policy");
  }
  const [command, ...args] = options.command;
  const transport = new StdioClientTransport({
    command,
    args,
    // The SDK passes only a few variables on by default; the gateway needs its token.
    env: { ...getDefaultEnvironment(), MCP_GATEWAY_TOKEN: token },
    stderr: "inherit",
  });
  const client = new Client({ name: "gateway-example", version: "1.0.0" }, { capabilities: { elicitation: { form: {} } } });

  const started = Date.now();
  const seconds = (): number => (Date.now() - started) / 1000;
  const questions: { message: string; at_s: number }[] = [];
  client.setRequestHandler(ElicitRequestSchema, async (request): Promise<ElicitResult> => {
    const params = request.params;
    const schema = "requestedSchema" in params ? params.requestedSchema : undefined;
    const field = schema?.properties?.decision as { enum?: string[] } | undefined;
    const choices = field?.enum ?? [];
    questions.push({ message: params.message, at_s: seconds() });
    if (options.answerAfterS > 0) {
      await new Promise((resolve) => setTimeout(resolve, options.answerAfterS * 1000));
    }
    const decision = options.answer ?? (await askThePerson(params.message, choices));
    if (!choices.includes(decision)) {
      return { action: "decline" };
    }
    return { action: "accept", content: { decision } };
  });

  await client.connect(transport);
  try {
    const { tools } = await client.listTools();
    const progress: (Progress & { at_s: number })[] = [];
    const result = await client.callTool({ name: "run_pytest", arguments: { test_path: options.testPath } }, undefined, {
      onprogress: (note: Progress) => {
        progress.push({ ...note, at_s: seconds() });
        console.error(`[${seconds().toFixed(1)} s] ${note.message ?? note.progress}`);
      },
      // The gateway sends a notification at least every 5 s while it waits: each one restarts the clock.
      resetTimeoutOnProgress: true,
      timeout: options.timeoutMs,
    });
    const report = {
      tools: tools.map((tool) => tool.name),
      questions,
      progress,
      result_at_s: seconds(),
      result,
    };
    process.stdout.write(`${JSON.stringify(report)}\n`);
  } finally {
    await client.close();
  }
}

main().catch((error: unknown) => {
  const data = typeof error === "object" && error !== null && "data" in error ? error.data : undefined;
  process.stderr.write(`${String(error)}${data === undefined ? "" : ` ${JSON.stringify(data)}`}\n`);
  process.exit(1);
});
