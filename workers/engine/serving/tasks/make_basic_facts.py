"""Writes ``d0_basic/basic_facts.jsonl``, the items of d0's own multiple-choice task (``d0_basic_facts``): facts a
135M-parameter chat model (the demo model, SmolLM2-135M-Instruct) answers well above chance, so the accuracy gate
has something to measure on a CPU in seconds. Deterministic (a fixed seed), so the committed file is what this
writes: ``python -m workers.engine.serving.tasks.make_basic_facts``.

Each item has four choices: the answer and three others of the same kind (the answers of other questions in its
category), so chance is 25%.
"""

import json
import random
from pathlib import Path

FOLDER = Path(__file__).parent / "d0_basic"
SEED = 30
CHOICES = 4

OPPOSITES = [("hot", "cold"), ("big", "small"), ("up", "down"), ("day", "night"), ("fast", "slow"),
             ("open", "closed"), ("wet", "dry"), ("happy", "sad"), ("full", "empty"), ("high", "low"),
             ("hard", "soft"), ("left", "right"), ("black", "white"), ("good", "bad"), ("rich", "poor"),
             ("early", "late"), ("strong", "weak"), ("thick", "thin"), ("loud", "quiet"), ("clean", "dirty"),
             ("true", "false"), ("inside", "outside"), ("win", "lose"), ("buy", "sell"), ("young", "old")]
PLURALS = [("cat", "cats"), ("child", "children"), ("mouse", "mice"), ("foot", "feet"), ("tooth", "teeth"),
           ("man", "men"), ("woman", "women"), ("box", "boxes"), ("baby", "babies"), ("leaf", "leaves"),
           ("knife", "knives"), ("goose", "geese"), ("dog", "dogs"), ("bus", "buses"), ("city", "cities"),
           ("person", "people"), ("sheep", "sheep"), ("wolf", "wolves"), ("house", "houses"), ("fox", "foxes")]
COLOURS = [("the sky on a clear day", "blue"), ("grass", "green"), ("a ripe banana", "yellow"), ("snow", "white"),
           ("coal", "black"), ("blood", "red"), ("a ripe tomato", "red"), ("milk", "white"),
           ("a lemon", "yellow"), ("the sun in a child's drawing", "yellow"), ("a carrot", "orange"),
           ("a leaf in summer", "green"), ("chocolate", "brown"), ("the sea", "blue"), ("a crow", "black")]
CAPITALS = [("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Germany", "Berlin"), ("Spain", "Madrid"),
            ("England", "London"), ("Russia", "Moscow"), ("China", "Beijing"), ("Egypt", "Cairo"),
            ("Greece", "Athens"), ("Canada", "Ottawa"), ("Ireland", "Dublin"), ("Portugal", "Lisbon"),
            ("Austria", "Vienna"), ("Norway", "Oslo")]
SOUNDS = [("dog", "barks"), ("cat", "meows"), ("cow", "moos"), ("lion", "roars"), ("snake", "hisses"),
          ("duck", "quacks"), ("bee", "buzzes"), ("horse", "neighs"), ("owl", "hoots"), ("pig", "oinks")]
PAST_TENSES = [("go", "went"), ("eat", "ate"), ("see", "saw"), ("run", "ran"), ("write", "wrote"), ("drink", "drank"),
               ("swim", "swam"), ("take", "took"), ("give", "gave"), ("speak", "spoke"), ("sing", "sang"),
               ("think", "thought"), ("buy", "bought"), ("fly", "flew"), ("come", "came")]
LANGUAGES = [("France", "French"), ("Germany", "German"), ("Italy", "Italian"), ("Spain", "Spanish"),
             ("Japan", "Japanese"), ("China", "Chinese"), ("Russia", "Russian"), ("Greece", "Greek"),
             ("Portugal", "Portuguese"), ("Poland", "Polish"), ("Sweden", "Swedish"), ("Turkey", "Turkish")]


def _questions() -> list[tuple[str, str, str]]:
    """(category, question, answer) for every item, in a fixed order."""
    items = [("opposites", f"What is the opposite of {word}?", answer) for word, answer in OPPOSITES]
    items += [("plurals", f"What is the plural of {word}?", answer) for word, answer in PLURALS]
    items += [("colours", f"What colour is {thing}?", answer) for thing, answer in COLOURS]
    items += [("capitals", f"What is the capital of {country}?", answer) for country, answer in CAPITALS]
    items += [("sounds", f"What does a {animal} do?", answer) for animal, answer in SOUNDS]
    items += [("past tenses", f"What is the past tense of {verb}?", answer) for verb, answer in PAST_TENSES]
    items += [("languages", f"What language is spoken in {country}?", answer) for country, answer in LANGUAGES]
    return items


def items() -> list[dict]:
    rng = random.Random(SEED)
    questions = _questions()
    answers_of: dict[str, list[str]] = {}
    for category, _, answer in questions:
        if answer not in answers_of.setdefault(category, []):
            answers_of[category].append(answer)
    rows = []
    for category, question, answer in questions:
        others = rng.sample([other for other in answers_of[category] if other != answer], CHOICES - 1)
        choices = others + [answer]
        rng.shuffle(choices)
        rows.append({"id": len(rows), "category": category, "question": question, "choices": choices,
                     "answer": choices.index(answer)})
    return rows


def short_answers() -> list[dict]:
    """The chat task's items (``d0_basic_chat``): the questions whose answer is one capitalised word, asked for in
    one word, answered in free text."""
    return [{"id": index, "category": category, "question": f"{question} Answer with one word.", "answer": answer}
            for index, (category, question, answer) in enumerate(
                item for item in _questions() if item[0] in ("capitals", "languages"))]


def _write(name: str, rows: list[dict]) -> None:
    (FOLDER / name).write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"{FOLDER / name}: {len(rows)} items")


if __name__ == "__main__":
    _write("basic_facts.jsonl", items())
    _write("basic_answers.jsonl", short_answers())
