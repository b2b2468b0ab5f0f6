"""Checks that a scripted demonstration parses as intended (tests only): every act classifies
as scripted, masks align with what the turn loop records, contexts are the workflow's own, and
the reward is the intended one."""
from __future__ import annotations

from memsearcher_jax.agent.parsing import (
    ActKind,
    classify_act,
    extract_boxed,
    extract_memory,
    tagged_outside_think,
)
from memsearcher_jax.agent.prompts import PromptBuilder, compact_system_prompt
from memsearcher_jax.agent.rollout import Conversation, Trajectory
from memsearcher_jax.agent.workflows.base import turn_hint
from memsearcher_jax.agent.workflows.fold import (
    BRANCH_CLOSE,
    BRANCH_OPEN,
    RETURN_CLOSE,
    RETURN_OPEN,
    fold_context,
    fold_parts,
    fold_system_prompt,
)
from memsearcher_jax.agent.workflows.mem1 import internal_state, mem1_context
from memsearcher_jax.agent.workflows.memory_ops import (
    apply_operations,
    memory_ops_context,
    parse_operations,
    render_bank,
)
from memsearcher_jax.agent.workflows.summary import (
    SUMMARY_CLOSE,
    SUMMARY_OPEN,
    question_parts,
    summary_context,
    summary_parts,
    system_prompt,
)
from memsearcher_jax.data.demos import Demonstration
from memsearcher_jax.data.synthetic import objectives_of
from memsearcher_jax.qa_metrics import (
    compute_reward,
    exact_match,
    token_f1,
)


def check_demonstration(demo: Demonstration, builder: PromptBuilder) -> list[str]:
    """Problems with a demonstration (empty list = parses as intended).

    Checks every act classifies as intended, masks align (1 on acts and updates, 0 on one
    observation span after each searching act), and the final reward is 1.0 for a correct demo
    and 0.1 (format credit, F1 = 0) for a wrong-answer demo. MemSearcher demos: prompts are
    rebuilt from the previous memory and every update's memory is extracted as scripted. ReAct
    demos: one conversation on react_context(question), each observation a tool-response
    message that re-opens `<think>`, and the recorded context length of every act call.
    """
    t = demo.trajectory
    checks = {"react": _check_react, "memsearcher": _check_memsearcher, "mem1": _check_mem1,
              "memory_ops": _check_memory_ops, "summary": _check_summary, "fold": _check_fold}
    if demo.workflow not in checks:
        return [f"unknown workflow {demo.workflow!r}"]
    problems = checks[demo.workflow](demo, builder)
    if not t.conversations:
        return problems + ["no conversations"]
    final = t.final
    if not final.is_final or any(c.is_final for c in t.conversations[:-1]):
        problems.append("is_final must be set on the last conversation only")
    if t.num_searches != demo.act_kinds.count(ActKind.TOOL_CALLS):
        problems.append(f"num_searches {t.num_searches} but {demo.act_kinds.count(ActKind.TOOL_CALLS)} searching acts")
    if len(objectives_of(demo.row)) > 1:
        return problems + _check_objective_answers(demo)
    res = compute_reward(final.blocks, final.ended_with_eos, t.golds)
    if demo.correct and res.reward != 1.0:
        problems.append(f"correct demo has reward {res.reward} ({res.failure or res.answer!r})")
    if not demo.correct and not (res.format_ok and res.reward == 0.1):
        problems.append(f"wrong-answer demo should get the 0.1 format credit, got {res.reward} ({res.failure})")
    return problems


def _check_objective_answers(demo: Demonstration) -> list[str]:
    """A multi-objective demo: well-formed, and its boxed answer split on ";" gives one answer per
    objective, each a gold one except (for a wrong or early answer) exactly one with F1 = 0."""
    final = demo.trajectory.final
    gate = compute_reward(final.blocks, final.ended_with_eos, ["-"])  # the format gate alone
    if not gate.format_ok:
        return [f"multi-objective demo is malformed: {gate.failure}"]
    parts = [p.strip() for p in (extract_boxed(final.blocks[-1]) or "").split(";")]
    objs = objectives_of(demo.row)
    if len(parts) != len(objs):
        return [f"{len(parts)} answers for {len(objs)} objectives"]
    right = [exact_match(p, o["golden_answers"]) for p, o in zip(parts, objs)]
    zero = [token_f1(p, o["golden_answers"]) == 0.0 for p, o in zip(parts, objs)]
    if demo.correct and not all(right):
        return [f"correct demo answers {parts} (objective golds {[o['golden_answers'][0] for o in objs]})"]
    if not demo.correct and not (sum(zero) == 1 and sum(right) == len(objs) - 1):
        return [f"a flawed demo should miss exactly one objective, got {parts}"]
    return []


def _act_end(conv: Conversation, builder: PromptBuilder, start: int) -> int | None:
    """Where the act starting at `start` ends: just past its first <|im_end|>."""
    try:
        return conv.response_ids.index(builder.eos_id, start) + 1
    except ValueError:
        return None


def _check_memsearcher(demo: Demonstration, builder: PromptBuilder) -> list[str]:
    """Prompts rebuilt from the previous memory; every update's memory extracted as scripted."""
    def carry(update_text: str, memory: str) -> tuple[str, str | None]:
        mem = extract_memory(update_text)
        return mem or "", mem

    return _check_rebuilt(demo, builder, "memsearcher_context(question, previous memory)",
                          lambda memory: builder.memsearcher_context(demo.trajectory.question, memory), carry, "")


def _check_memory_ops(demo: Demonstration, builder: PromptBuilder) -> list[str]:
    """Prompts rebuilt from the bank the previous operations left; each operations block applies
    without error and leaves the scripted bank."""
    def carry(ops_text: str, entries: list) -> tuple[list, str | None]:
        ops, errors = parse_operations(ops_text)
        entries, _, refused = apply_operations(entries, len(entries) + 1, ops, 1 << 30, builder.count_tokens)
        return entries, (None if errors or refused else render_bank(entries))

    return _check_rebuilt(demo, builder, "memory_ops_context(question, previous bank)",
                          lambda entries: memory_ops_context(builder, demo.trajectory.question, entries, []), carry, [])


def _check_rebuilt(demo: Demonstration, builder: PromptBuilder, context_name: str, context_of, carry, state):
    """One conversation per turn: context_of(state) is the prompt; act (mask 1), then for a search
    one masked observation and a second call (mask 1) that carry(text, state) turns into
    (next state, the memory it shows, None when unreadable)."""
    problems = []
    t = demo.trajectory
    if len(t.conversations) != len(demo.act_kinds):
        problems.append(f"{len(t.conversations)} conversations but {len(demo.act_kinds)} intended acts")
    mem_iter = iter(demo.memories)
    for k, (conv, kind) in enumerate(zip(t.conversations, demo.act_kinds)):
        where = f"turn {k}"
        if conv.prompt_ids != context_of(state):
            problems.append(f"{where}: prompt is not {context_name}")
        act_end = _check_act(conv, kind, builder, where, problems)
        if act_end is None:
            continue
        if kind == ActKind.TOOL_CALLS:
            expected_mem = next(mem_iter, None)
            zeros = [j for j, m in enumerate(conv.loss_mask) if m == 0]
            if not zeros or zeros[0] != act_end or zeros[-1] - zeros[0] + 1 != len(zeros):
                problems.append(f"{where}: the observation is not one masked span right after the act")
                continue
            update = conv.response_ids[zeros[-1] + 1:]
            state, mem = carry(builder.decode_update(update), state)
            if mem is None or mem != expected_mem:
                problems.append(f"{where}: the second call gives memory {mem!r}, scripted {expected_mem!r}")
            if not update or update[-1] != builder.eos_id:
                problems.append(f"{where}: the second call does not end with the end-of-turn token")
        elif len(conv.response_ids) != act_end:
            problems.append(f"{where}: answer turn has tokens after its act")
    return problems


def _check_act(conv: Conversation, kind: ActKind, builder: PromptBuilder, where: str, problems: list) -> int | None:
    """The act at the start of conv's response: aligned, ended, classified as intended, all in the
    loss mask. Returns where it ends (None if it has no end)."""
    if not (len(conv.response_ids) == len(conv.loss_mask) == len(conv.sampler_logprobs)):
        problems.append(f"{where}: response_ids, loss_mask and sampler_logprobs differ in length")
    # Split the response where the rollout would: the act ends at its first <|im_end|>.
    act_end = _act_end(conv, builder, 0)
    if act_end is None:
        problems.append(f"{where}: act has no end-of-turn token")
        return None
    got = classify_act(builder.decode_act(conv.response_ids[:act_end]))
    if got != kind:
        problems.append(f"{where}: act classifies as {got.value}, intended {kind.value}")
    if any(m != 1 for m in conv.loss_mask[:act_end]):
        problems.append(f"{where}: act tokens not all in the loss mask")
    return act_end


def _check_mem1(demo: Demonstration, builder: PromptBuilder) -> list[str]:
    """One conversation per turn holding the act alone; its prompt is the first context, then
    the previous act and a masked-style tool-response message re-opening `<think>`."""
    problems = []
    t = demo.trajectory
    if len(t.conversations) != len(demo.act_kinds):
        problems.append(f"{len(t.conversations)} conversations but {len(demo.act_kinds)} intended acts")
    first = mem1_context(builder, t.question, [], [])
    obs_head = [*builder._obs_user_header, builder.tool_response_open_id]
    obs_tail = [*builder._turn_end_newline, *builder._assistant_header, builder.think_id]
    for k, (conv, kind) in enumerate(zip(t.conversations, demo.act_kinds)):
        where = f"turn {k}"
        prefix = first + (t.conversations[k - 1].response_ids if k else [])
        obs = conv.prompt_ids[len(prefix):]
        if conv.prompt_ids[:len(prefix)] != prefix or (k and (obs[:len(obs_head)] != obs_head
                                                               or obs[-len(obs_tail):] != obs_tail)) or (not k and obs):
            problems.append(f"{where}: prompt is not the question, the last act and its observation")
        act_end = _check_act(conv, kind, builder, where, problems)
        if act_end is not None and act_end != len(conv.response_ids):
            problems.append(f"{where}: the response holds more than the act")
    states = [internal_state(c.blocks[0]) for c, kind in zip(t.conversations, demo.act_kinds)
              if kind == ActKind.TOOL_CALLS and c.blocks]
    if states != demo.memories:
        problems.append(f"internal states {states} differ from the recorded memories {demo.memories}")
    return problems


def _check_react(demo: Demonstration, builder: PromptBuilder) -> list[str]:
    problems = []
    t = demo.trajectory
    if len(t.conversations) != 1:
        return [f"a ReAct demo is one conversation, got {len(t.conversations)}"]
    conv = t.final
    if conv.prompt_ids != builder.react_context(t.question):
        problems.append("prompt is not react_context(question)")
    if not (len(conv.response_ids) == len(conv.loss_mask) == len(conv.sampler_logprobs)):
        return problems + ["response_ids, loss_mask and sampler_logprobs differ in length"]
    if demo.memories or t.memories:
        problems.append("a ReAct demo keeps no memory")
    if len(t.context_tokens) != len(demo.act_kinds):
        problems.append(f"{len(t.context_tokens)} recorded context lengths but {len(demo.act_kinds)} intended acts")
    # An observation is a user message of tool responses that hands the turn back with <think>.
    obs_head = [*builder._obs_user_header, builder.tool_response_open_id]
    obs_tail = [*builder._turn_end_newline, *builder._assistant_header, builder.think_id]
    pos = 0
    for k, kind in enumerate(demo.act_kinds):
        where = f"act {k}"
        if k < len(t.context_tokens) and t.context_tokens[k] != len(conv.prompt_ids) + pos:
            problems.append(f"{where}: recorded context {t.context_tokens[k]} tokens, the act's prefix has "
                            f"{len(conv.prompt_ids) + pos}")
        end = _act_end(conv, builder, pos)
        if end is None:
            problems.append(f"{where}: act has no end-of-turn token")
            return problems
        got = classify_act(builder.decode_act(conv.response_ids[pos:end]))
        if got != kind:
            problems.append(f"{where}: act classifies as {got.value}, intended {kind.value}")
        if any(m != 1 for m in conv.loss_mask[pos:end]):
            problems.append(f"{where}: act tokens not all in the loss mask")
        pos = end
        if kind == ActKind.TOOL_CALLS:
            obs_end = pos
            while obs_end < len(conv.loss_mask) and conv.loss_mask[obs_end] == 0:
                obs_end += 1
            obs = conv.response_ids[pos:obs_end]
            if (len(obs) < len(obs_head) + len(obs_tail) or obs[:len(obs_head)] != obs_head
                    or obs[-len(obs_tail):] != obs_tail):
                problems.append(f"{where}: no masked tool-response observation (ending in the <think> "
                                f"pre-fill) right after the act")
            pos = obs_end
    if pos != len(conv.response_ids):
        problems.append(f"{len(conv.response_ids) - pos} response tokens after the final act")
    if len(conv.blocks) != len(demo.act_kinds):
        problems.append(f"{len(conv.blocks)} decoded blocks but {len(demo.act_kinds)} acts")
    return problems


def _walk_acts(conv: Conversation, builder: PromptBuilder, kinds, where: str, problems: list) -> list[str]:
    """A react-like conversation (summary's segment, fold's branch): acts in the loss mask, each
    searching one followed by a masked tool-response observation that re-opens `<think>`, except the
    conversation's last act. Returns the decoded act blocks."""
    obs_head = [*builder._obs_user_header, builder.tool_response_open_id]
    obs_tail = [*builder._turn_end_newline, *builder._assistant_header, builder.think_id]
    blocks, pos = [], 0
    while pos < len(conv.response_ids):
        kind, end = next(kinds, None), _act_end(conv, builder, pos)
        if kind is None or end is None:
            problems.append(f"{where}: an act with no end-of-turn token, or more acts than intended")
            return blocks
        blocks.append(builder.decode_act(conv.response_ids[pos:end]))
        if classify_act(blocks[-1]) != kind or any(m != 1 for m in conv.loss_mask[pos:end]):
            problems.append(f"{where}: act {len(blocks) - 1} is not an intended {kind.value} act in the loss mask")
        pos = end
        while pos < len(conv.loss_mask) and conv.loss_mask[pos] == 0:
            pos += 1
        obs = conv.response_ids[end:pos]
        if obs and (obs[:len(obs_head)] != obs_head or obs[-len(obs_tail):] != obs_tail):
            problems.append(f"{where}: the observation after act {len(blocks) - 1} is not a tool-response message")
    return blocks


def _check_carried(demo: Demonstration, builder: PromptBuilder, first: list[int], head_of) -> list[str]:
    """One conversation per segment (summary) or branch (fold): the first on `first`; each later one
    on head_of(the previous conversation's last act block) (None: unreadable), then the tool responses of
    that act's search and the `<think>` pre-fill; every act as scripted."""
    problems, t, kinds = [], demo.trajectory, iter(demo.act_kinds)
    obs_tail = [*builder._turn_end_newline, *builder._assistant_header, builder.think_id]
    last = None
    for k, conv in enumerate(t.conversations):
        head = first if k == 0 else head_of(last)
        rest = conv.prompt_ids[len(head or []):]
        if k == 0 and conv.prompt_ids != first:
            problems.append("conversation 0: prompt is not the workflow's first context")
        elif k and (head is None or conv.prompt_ids[:len(head)] != head or rest[:1] != [builder.tool_response_open_id]
                    or rest[-len(obs_tail):] != obs_tail):
            problems.append(f"conversation {k}: prompt is not the carried text, then the last search's results")
        last = (_walk_acts(conv, builder, kinds, f"conversation {k}", problems) or [None])[-1]
    if next(kinds, None) is not None:
        problems.append("fewer acts than intended")
    return problems


def _first_hint(demo: Demonstration, builder: PromptBuilder) -> str:
    """The hint line of the episode's first act (no search made yet), "" when the builder shows none."""
    t = demo.trajectory
    return turn_hint(builder, Trajectory(0, 0, t.question, [], max_turns=t.max_turns, subjects=t.subjects), 0)


def _head(builder: PromptBuilder, system: str, parts) -> list[int]:
    return [*builder.system_ids(system), builder.im_start_id, *builder.encode("user\n"),
            *builder.encode_parts(*parts, "\n")]


def _check_summary(demo: Demonstration, builder: PromptBuilder) -> list[str]:
    """Segments: each after the first opens on the question and the summary the last act wrote; the
    memories are those summaries."""
    q = demo.trajectory.question
    summaries = []

    def head_of(block):
        summary = tagged_outside_think(block or "", SUMMARY_OPEN, SUMMARY_CLOSE)
        summaries.append(summary)
        return None if summary is None else _head(builder, system_prompt(builder), question_parts(q)
                                                  + summary_parts(summary))

    first = summary_context(builder, q, hint=_first_hint(demo, builder))
    problems = _check_carried(demo, builder, first, head_of)
    if summaries != demo.memories:
        problems.append(f"summaries {summaries} differ from the recorded memories {demo.memories}")
    return problems


def _check_fold(demo: Demonstration, builder: PromptBuilder) -> list[str]:
    """Branches: each after the first opens on the question, every return so far and the task the last
    act named; the memories are the returns after each fold."""
    q, returns, memories = demo.trajectory.question, [], []
    system = fold_system_prompt(builder.default_top_n, builder.tool) if builder.style == "full" else None

    def head_of(block):
        returned = tagged_outside_think(block or "", RETURN_OPEN, RETURN_CLOSE)
        if returned is None:
            return None
        returns.append(returned)
        memories.append("\n".join(returns))
        task = tagged_outside_think(block, BRANCH_OPEN, BRANCH_CLOSE)
        return _head(builder, system or compact_system_prompt(builder.tool), fold_parts(q, returns, task))

    first = fold_context(builder, q, hint=_first_hint(demo, builder))
    problems = _check_carried(demo, builder, first, head_of)
    if memories != demo.memories:
        problems.append(f"returns {memories} differ from the recorded memories {demo.memories}")
    return problems
