"""The think block and its budget (inference/engine/think_block.py): opened by the prompt or by the output's first
text, closed by the model or, once the budget is spent inside it, by forcing the closing text's tokens."""

from inference.engine.think_block import ThinkBlock, opens_think

CLOSE_IDS = [7, 8, 9]


def drive(block: ThinkBlock, texts: list[str]) -> list[int | None]:
    """The forced token before each step, feeding `texts` as the model's own output where nothing is forced."""
    forced = []
    for text in texts:
        forced.append(block.forced_token)
        block.observe("" if block.forced_token is not None else text)
    return forced


def test_a_prompt_that_leaves_think_open():
    assert opens_think("<|im_start|>assistant\n<think>\n")
    assert not opens_think("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not opens_think("<|im_start|>assistant\n")


def test_the_budget_forces_the_close_after_that_many_tokens_inside():
    block = ThinkBlock(opened=True, budget=3, close_ids=CLOSE_IDS)
    assert drive(block, ["a", "b", "c", "x", "y", "z", "answer"]) == [None, None, None, 7, 8, 9, None]
    assert block.state == "closed" and block.tokens == 3


def test_a_block_the_model_closes_is_not_forced():
    block = ThinkBlock(opened=True, budget=3, close_ids=CLOSE_IDS)
    assert drive(block, ["a", "</thi", "nk>", "answer", "more"]) == [None] * 5
    assert block.state == "closed"


def test_the_output_may_open_the_block_itself_and_an_answer_without_one_is_left_alone():
    opened = ThinkBlock(opened=False, budget=2, close_ids=CLOSE_IDS)
    assert drive(opened, [" <thi", "nk>", "a", "b", "x", "y", "z"]) == [None, None, None, None, 7, 8, 9]
    plain = ThinkBlock(opened=False, budget=2, close_ids=CLOSE_IDS)
    assert drive(plain, ["Hello", "a", "b", "c"]) == [None] * 4
    assert plain.state == "closed"


def test_no_budget_never_forces():
    block = ThinkBlock(opened=True, budget=0, close_ids=CLOSE_IDS)
    assert drive(block, ["a"] * 50) == [None] * 50
