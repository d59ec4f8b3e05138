"""An OpenAI Agents SDK agent whose model calls go through Switchyard's front door.

    export SWITCHYARD_API_TOKEN=...
    switchyard serve --pool workflows/pools/live-emulated.yaml --workflow tests/fixtures/tiny_chain.yaml &
    python examples/python/openai_agents.py [--url http://127.0.0.1:8080] [--model Qwen3-0.6B]
"""

import argparse
import asyncio
import os
import sys
import uuid

from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
from openai import AsyncOpenAI


async def run(url: str, model: str) -> int:
    set_tracing_disabled(True)  # no network calls to OpenAI's trace exporter
    client = AsyncOpenAI(
        base_url=f"{url}/v1",
        api_key=os.environ["SWITCHYARD_API_TOKEN"],
        default_headers={"X-Session-ID": f"agents-sdk-{uuid.uuid4()}"},
    )
    agent = Agent(
        name="Greeter",
        instructions="Greet the user in one short sentence.",
        model=OpenAIChatCompletionsModel(model=model, openai_client=client),
        model_settings=ModelSettings(max_tokens=16),
    )
    result = await Runner.run(agent, "Hello!")
    print(f"agent answered: {result.final_output}")
    return 0 if result.final_output else 1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default=os.environ.get("SWITCHYARD_URL", "http://127.0.0.1:8080"))
    ap.add_argument("--model", default="Qwen3-0.6B")
    args = ap.parse_args()
    return asyncio.run(run(args.url, args.model))


if __name__ == "__main__":
    sys.exit(main())
