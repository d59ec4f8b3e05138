"""A LangGraph agent whose LLM calls Switchyard schedules: a planner → tool → writer graph on
`ChatOpenAI` pointed at `switchyard serve`'s front door, one program per run (X-Session-ID).

    export SWITCHYARD_API_TOKEN=...   # the server's token
    switchyard serve --pool workflows/pools/live-emulated.yaml --workflow tests/fixtures/tiny_chain.yaml &
    python examples/python/langgraph_agent.py [--url http://127.0.0.1:8080] [--model Qwen3-0.6B]

The planner's call streams (token by token through the front door); the tool between the two
calls is the program's own time; the writer's call says `program_done`.
"""

import argparse
import os
import sys
import uuid
from typing import TypedDict

from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph


class State(TypedDict):
    question: str
    plan: str
    facts: str
    answer: str


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default=os.environ.get("SWITCHYARD_URL", "http://127.0.0.1:8080"))
    ap.add_argument("--model", default="Qwen3-0.6B")
    args = ap.parse_args()
    token = os.environ["SWITCHYARD_API_TOKEN"]
    session = f"langgraph-{uuid.uuid4()}"

    def llm(last: bool = False) -> ChatOpenAI:
        headers = {"X-Session-ID": session}
        if last:
            headers["X-Program-Done"] = "true"
        return ChatOpenAI(
            base_url=f"{args.url}/v1",
            api_key=token,
            model=args.model,
            max_tokens=24,
            default_headers=headers,
            streaming=True,
        )

    pieces = []

    def plan(state: State) -> dict:
        text = ""
        for chunk in llm().stream(f"Plan how to answer: {state['question']}"):
            pieces.append(chunk.content)
            text += chunk.content
        return {"plan": text}

    def lookup(state: State) -> dict:
        # A tool: the program's own time between its LLM calls.
        return {"facts": f"{len(state['plan'].split())} words of plan"}

    def write(state: State) -> dict:
        reply = llm(last=True).invoke(f"Plan: {state['plan']}\nFacts: {state['facts']}\nWrite the answer.")
        return {"answer": reply.content}

    graph = StateGraph(State)
    graph.add_node("plan", plan)
    graph.add_node("lookup", lookup)
    graph.add_node("write", write)
    graph.add_edge(START, "plan")
    graph.add_edge("plan", "lookup")
    graph.add_edge("lookup", "write")
    graph.add_edge("write", END)
    result = graph.compile().invoke({"question": "Why do agents need a scheduler?"})
    print(f"plan ({len(pieces)} streamed pieces): {result['plan']}")
    print(f"answer: {result['answer']}")
    if len(pieces) < 5 or not result["answer"]:
        print("error: expected a streamed plan and an answer", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
