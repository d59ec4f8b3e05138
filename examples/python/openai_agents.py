"""An OpenAI Agents SDK agent with a function tool, whose model calls go through Switchyard's
front door: the model calls the tool (OpenAI function calling, passed on to the engine — on the
emulated pool, `switchyard emulate`'s stand-in model calls the first tool once per user turn),
the SDK runs it, and the model answers with its result.

    export SWITCHYARD_API_TOKEN=...
    switchyard serve --pool workflows/pools/live-emulated.yaml --workflow tests/fixtures/tiny_chain.yaml &
    python examples/python/openai_agents.py [--url http://127.0.0.1:8080] [--model Qwen3-0.6B]
"""

import argparse
import asyncio
import os
import sys
import uuid

from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI


async def run(url: str, model: str) -> int:
    set_tracing_disabled(True)  # no network calls to OpenAI's trace exporter
    client = AsyncOpenAI(
        base_url=f"{url}/v1",
        api_key=os.environ["SWITCHYARD_API_TOKEN"],
        default_headers={"X-Session-ID": f"agents-sdk-{uuid.uuid4()}"},
    )
    calls = []

    @function_tool
    def local_time(city: str) -> str:
        """The local time in a city."""
        calls.append(city)
        return f"It is 12:00 in {city}."

    agent = Agent(
        name="Clock",
        instructions="Answer with the local time, using the tool.",
        model=OpenAIChatCompletionsModel(model=model, openai_client=client),
        model_settings=ModelSettings(max_tokens=64),
        tools=[local_time],
    )
    result = await Runner.run(agent, "What time is it in Paris?")
    print(f"tool calls: {len(calls)} ({calls})")
    print(f"agent answered: {result.final_output}")
    if not calls or not result.final_output:
        print("error: expected a tool call and an answer", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default=os.environ.get("SWITCHYARD_URL", "http://127.0.0.1:8080"))
    ap.add_argument("--model", default="Qwen3-0.6B")
    args = ap.parse_args()
    return asyncio.run(run(args.url, args.model))


if __name__ == "__main__":
    sys.exit(main())
