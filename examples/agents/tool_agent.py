"""An agent rlvr does not know: a tool loop over the official OpenAI client, trained with

    rlvr train data.env=external external.command='python examples/agents/tool_agent.py' ...

rlvr runs it once per episode with OPENAI_BASE_URL / OPENAI_API_KEY pointing at its rollout gateway (the key names
the episode) and the problem in RLVR_PROBLEM; the last stdout line is the reward. Nothing here imports rlvr.
"""

import json
import os

from openai import OpenAI

TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression such as 12*(3+4).",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]


def calculator(expression: str) -> str:
    if not expression or set(expression) - set("0123456789+-*/() "):
        return "error: only digits, + - * / and parentheses"
    try:
        return str(eval(expression, {"__builtins__": {}}))  # the character check above keeps this to arithmetic
    except Exception as exc:  # noqa: BLE001 - the model sees the error and may try again
        return f"error: {exc}"


def main() -> None:
    problem = json.loads(os.environ["RLVR_PROBLEM"])
    client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    model = os.environ.get("OPENAI_MODEL", "policy")
    messages = [{"role": "system", "content": "Use the calculator, then answer with the number only."},
                {"role": "user", "content": problem["question"]}]
    reply = None
    for _ in range(3):
        reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                               max_tokens=256).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            args = json.loads(call.function.arguments or "{}")
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": calculator(str(args.get("expression", "")))})
    answer = (reply.content or "").strip() if reply is not None else ""
    print(json.dumps({"reward": float(answer == problem["reference"].strip())}))


if __name__ == "__main__":
    main()
