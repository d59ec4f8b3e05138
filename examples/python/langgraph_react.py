"""A LangGraph ReAct agent (`create_react_agent`) with a real tool, whose model calls go through
Switchyard's front door: the model calls the tool with OpenAI function calling (passed on to the
engine — on the emulated pool, `switchyard emulate`'s stand-in model calls the first tool once
per user turn), LangGraph runs it, and the model answers with its result. The answer streams
token by token (`stream_mode="messages"`).

    export SWITCHYARD_API_TOKEN=...   # the server's token
    switchyard serve --pool workflows/pools/live-emulated.yaml --workflow tests/fixtures/tiny_chain.yaml &
    python examples/python/langgraph_react.py [--url http://127.0.0.1:8080] [--model Qwen3-0.6B]
"""

import argparse
import os
import sys
import uuid
import warnings

from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent

# LangGraph 1.x points to `langchain.agents.create_agent` (the `langchain` package, not pinned
# here) as the successor of its prebuilt ReAct agent, which it keeps until 2.0.
warnings.filterwarnings("ignore", message="create_react_agent has been moved")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default=os.environ.get("SWITCHYARD_URL", "http://127.0.0.1:8080"))
    ap.add_argument("--model", default="Qwen3-0.6B")
    args = ap.parse_args()
    calls = []

    @tool
    def weather(city: str) -> str:
        """Today's weather in a city."""
        calls.append(city)
        return f"Sunny, 21 °C in {city}."

    llm = ChatOpenAI(
        base_url=f"{args.url}/v1",
        api_key=os.environ["SWITCHYARD_API_TOKEN"],
        model=args.model,
        max_tokens=64,
        streaming=True,
        # One program per run: its calls are one session of the planner (TAO's cache credit
        # keeps the conversation where its prefix is).
        default_headers={"X-Session-ID": f"langgraph-react-{uuid.uuid4()}"},
    )
    agent = create_react_agent(llm, [weather])
    messages = []
    pieces = 0
    for chunk, _meta in agent.stream({"messages": [("user", "What is the weather in Paris?")]}, stream_mode="messages"):
        pieces += 1
        messages.append(chunk)
    called = [c["name"] for m in messages if isinstance(m, AIMessage) for c in (m.tool_calls or [])]
    results = [m.content for m in messages if isinstance(m, ToolMessage)]
    answer = "".join(m.content for m in messages if isinstance(m, AIMessage) and isinstance(m.content, str))
    print(f"tool calls: {len(calls)} ({called}); tool results: {results}")
    print(f"answer ({pieces} streamed pieces): {answer[:120]}")
    if len(calls) != 1 or not answer:
        print("error: expected one tool call and a streamed answer", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
