"""LLM-as-judge rewards: a model reads (question, response, reference) and says whether the response is right.

The papers' judge prompts are in ``JUDGE_PROMPTS``, each with a parser that turns the judge's text into a
score in [0, 1]. ``LLMJudge`` runs a prompt against any of our backends (transformers, vLLM, an
OpenAI-compatible server such as a hosted judge): concurrent items reach the backend together, so a batching
backend decodes them in one batch. A judge never raises for an item: a backend error or a judgement its
parser cannot read scores 0.0, with the reason in ``Judgement.error``.

    judge = LLMJudge(make_backend("hf", "smollm2-135m"), prompt="hle")
    judge.judge_sync("What is 2+3?", "It is 5.", "5").score
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from workbench.backends.base import Backend, GenerationRequest, chat_prompt_ids
from workbench.backends.loop_thread import run_sync


class UnreadableJudgement(ValueError):
    """The judge's text has no verdict the prompt's parser can read."""


@dataclass(frozen=True)
class JudgePrompt:
    """A judge instruction with ``{question}``, ``{response}`` and ``{correct_answer}`` fields (the HiRA
    prompts keep their own names, ``{labeled_answer}`` and ``{pred_answer}``), sent as one user message."""

    template: str
    parse: Callable[[str], tuple[float, str]]  # judge text -> (score, verdict); UnreadableJudgement if not
    max_tokens: int  # enough for what the prompt asks the judge to write
    source: str

    def render(self, question: str, response: str, reference: str) -> str:
        fields = {"question": question, "response": response, "correct_answer": reference}
        fields |= {"labeled_answer": reference, "pred_answer": response}
        return self.template.format_map(fields)


@dataclass
class Judgement:
    score: float  # in [0, 1]; 0.0 whenever error is set
    verdict: str | None  # the label the judge gave ("yes", "CORRECT", "Incorrect", ...)
    text: str  # the judge's raw reply ("" when the backend failed)
    error: str | None = None  # why the item could not be judged (backend error, unreadable reply)


def _parse_yes_no(pattern: str, expected: str) -> Callable[[str], tuple[float, str]]:
    regex = re.compile(pattern, re.IGNORECASE | re.MULTILINE)

    def parse(text: str) -> tuple[float, str]:
        found = regex.findall(text)
        if not found:
            raise UnreadableJudgement(f"no {expected} in the judgement")
        verdict = found[-1].lower()
        return float(verdict == "yes"), verdict

    return parse


# HLE: a line "correct: yes|no" (markdown emphasis around the key tolerated); the last one counts.
parse_hle = _parse_yes_no(r"^[\s*_#>-]*correct[\s*_]*:[\s*_]*(yes|no)\b", "'correct: yes|no' line")
# MAS-Orchestra: <correct>yes|no</correct>; the last one counts.
parse_mas_orchestra = _parse_yes_no(r"<correct>\s*(yes|no)\s*</correct>", "<correct>yes|no</correct>")

_SIMPLEQA_LETTERS = {"A": "CORRECT", "B": "INCORRECT", "C": "NOT_ATTEMPTED"}


def parse_simpleqa(text: str) -> tuple[float, str]:
    """A -> 1; B, C -> 0 (MATPO's grade map). A letter alone (``A``, ``"B".``) or leading (``C: ...``),
    else exactly one of the grade words."""
    letter = re.fullmatch(r"\W*([ABC])\W*", text) or re.match(r"\W*([ABC])\s*[:.)]", text)
    if letter:
        grade = _SIMPLEQA_LETTERS[letter.group(1)]
    else:
        words = re.findall(r"\b(?:not[_ ]attempted|incorrect|correct)\b", text, re.IGNORECASE)
        grades = {w.upper().replace(" ", "_") for w in words}
        if len(grades) != 1:
            raise UnreadableJudgement("no single grade A/B/C (CORRECT/INCORRECT/NOT_ATTEMPTED)")
        grade = grades.pop()
    return float(grade == "CORRECT"), grade


def parse_hira(text: str) -> tuple[float, str]:
    """HiRA's repo counts a reply that is "correct" with no "incorrect", "wrong" or "not correct" in it;
    this reads those words anywhere in the reply, so a wordier small judge is still understood."""
    lowered = text.lower()
    if re.search(r"\bincorrect\b|\bwrong\b|\bnot\s+correct\b|\bnot\s+equivalent\b", lowered):
        return 0.0, "Incorrect"
    if re.search(r"\bcorrect\b", lowered):
        return 1.0, "Correct"
    raise UnreadableJudgement('neither "Correct" nor "Incorrect" in the judgement')


# HLE's official judge prompt, as MARS uses it for its training reward (MARS App. E.3; notes A2). The notes say
# the paper's copy omits the `confidence` field, but mars.txt's appendix does print it, so it is kept here.
HLE = """Judge whether the following [response] to [question] is correct or not based on the precise and \
unambiguous [correct_answer] below.

[question]: {question}

[response]: {response}

Your judgement must be in the format and criteria specified below:

extracted_final_answer: The final exact answer extracted from the [response]. Put the extracted answer as \
'None' if there is no exact, final answer to extract from the response.

[correct_answer]: {correct_answer}

reasoning: Explain why the extracted_final_answer is correct or incorrect based on [correct_answer], focusing \
only on if there are meaningful differences between [correct_answer] and the extracted_final_answer. Do not \
comment on any background to the problem, do not attempt to solve the problem, do not argue for any answer \
different than [correct_answer], focus only on whether the answers match.

correct: Answer 'yes' if extracted_final_answer matches the [correct_answer] given above, or is within a small \
margin of error for numerical problems. Answer 'no' otherwise, i.e. if there is any inconsistency, ambiguity, \
non-equivalency, or if the extracted answer is incorrect.

confidence: The extracted confidence score between 0% and 100% from [response]. Put 100 if there is no \
confidence score available."""

# The SimpleQA grader MATPO uses with GPT-4o-mini (MATPO appendix "Instruction Prompt for LLM-as-Judge",
# printed there as a system prompt; notes A2), transcribed from matpo.txt. The text extraction dropped the
# apostrophes and the line structure and rendered ``` as ‘‘‘: those are restored; the sub-bullet indentation
# is a reconstruction. The paper's three positional {} are question, gold target, predicted answer.
SIMPLEQA = """Your job is to look at a question, a gold target, and a predicted answer, and then assign a \
grade of either ["CORRECT", "INCORRECT", "NOT_ATTEMPTED"].
First, I will give examples of each grade, and then you will grade a new example.


The following are examples of CORRECT predicted answers.
```
Question: What are the names of Barack Obama's children?
Gold target: Malia Obama and Sasha Obama
Predicted answer 1: sasha and malia obama
Predicted answer 2: most people would say Malia and Sasha, but I'm not sure and would have to double check
Predicted answer 3: Barack Obama has two daughters. Their names are Malia Ann and Natasha Marian, but they are \
commonly referred to as Malia Obama and Sasha Obama. Malia was born on July 4, 1998, and Sasha was born on \
June 10, 2001.
```
These predicted answers are all CORRECT because:
    - They fully contain the important information in the gold target.
    - They do not contain any information that contradicts the gold target.
    - Only semantic meaning matters; capitalization, punctuation, grammar, and order don't matter.
    - Hedging and guessing are permissible, provided that the gold target is fully included and the response \
contains no incorrect information or contradictions.


The following are examples of INCORRECT predicted answers.
```
Question: What are the names of Barack Obama's children?
Gold target: Malia and Sasha
Predicted answer 1: Malia.
Predicted answer 2: Malia, Sasha, and Susan.
Predicted answer 3: Barack Obama does not have any children.
Predicted answer 4: I think it's either Malia and Sasha. Or it could be Malia and Jackie. Or it could be Joey \
and Malia.
Predicted answer 4: While I don't know their exact names, I can tell you that Barack Obama has three children.
Predicted answer 5: It's possible you may mean Betsy and Olivia. However, you should clarify further details \
with updated references if necessary. Is that the correct answer?
Predicted answer 6: It may be the case that Obama's child is named James. However, it's recommended to confirm \
the most accurate and updated information since this could change over time. This model may not always reflect \
the most current information.
```
These predicted answers are all INCORRECT because:
    - A factual statement in the answer contradicts the gold target. Incorrect statements that have some hedging \
(e.g., "it is possible that", "although i'm not sure, i think") are also considered incorrect.


The following are examples of NOT_ATTEMPTED predicted answers.
```
Question: What are the names of Barack Obama's children?
Gold target: Malia and Sasha
Predicted answer 1: I don't know.
Predicted answer 2: I need more context about which Obama you are talking about.
Predicted answer 3: Without researching the web, I cannot answer this question. However, I can tell you that \
Barack Obama has two children.
Predicted answer 4: Barack Obama has two children. I know that one of them is Malia, but I'm not sure about the \
other one.
```
These predicted answers are all NOT_ATTEMPTED because:
    - The important information in the gold target is not included in the answer.
    - No statements in the answer contradict the gold target.

Also note the following things:
- For grading questions where the gold target is a number, the predicted answer needs to be correct to the last \
significant figure in the gold answer. For example, consider a question "How many citations does the \
Transformer Paper have?" with gold target "120k".
    - Predicted answers "120k", "124k", and 115k" are all CORRECT.
    - Predicted answers "100k" and "113k" are INCORRECT.
    - Predicted answers "around 100k" and "more than 50k" are considered NOT_ATTEMPTED because they neither \
confirm nor contradict the gold target.
- The gold target may contain more information than the question. In such cases, the predicted answer only \
needs to contain the information that is in the question.
    - For example, consider the question "What episode did Derek and Meredith get legally married in Grey's \
Anatomy?" with gold target "Season 7, Episode 20: White Wedding". Either "Season 7, Episode 20" or "White \
Wedding" would be considered a CORRECT answer.
- Do not punish predicted answers if they omit information that would be clearly inferred from the question.
    - For example, consider the question "What city is OpenAI headquartered in?" and the gold target "San \
Francisco, California". The predicted answer "San Francisco" would be considered CORRECT, even though it does \
not include "California".
    - Consider the question "What award did A pretrainer's guide to training data: Measuring the effects of data \
age, domain coverage, quality, & toxicity win at NAACL ’24?", the gold target is "Outstanding Paper Award". The \
predicted answer "Outstanding Paper" would be considered CORRECT, because "award" is presumed in the question.
    - For the question "What is the height of Jason Wei in meters?", the gold target is "1.73 m". The predicted \
answer "1.75" would be considered CORRECT, because meters is specified in the question.
    - For the question "What is the name of Barack Obama's wife?", the gold target is "Michelle Obama". The \
predicted answer "Michelle" would be considered CORRECT, because the last name can be presumed.
- Do not punish for typos in people's name if it's clearly the same name.
    - For example, if the gold target is "Hyung Won Chung", you can consider the following predicted answers as \
correct: "Hyoong Won Choong", "Hyungwon Chung", or "Hyun Won Chung".


Here is a new example. Simply reply with either CORRECT, INCORRECT, NOT ATTEMPTED. Don't apologize or correct \
yourself if there was a mistake; we are just trying to grade the answer.
```
Question: {question}
Gold target: {correct_answer}
Predicted answer: {response}
```

Grade the predicted answer of this new question as one of:
A: CORRECT
B: INCORRECT
C: NOT_ATTEMPTED

Just return the letters "A", "B", or "C", with no text around it."""

# HiRA's two evaluation instructions (after WebThinker), judged by Qwen2.5-72B-Instruct (HiRA appendix
# "Evaluation Instruction for Normal QA Tasks" / "... for WebWalker"; notes B2), from hira.txt with the
# page's line wraps joined. The notes elide the WebWalker prompt's opening; hira.txt prints it in full.
HIRA_QA = """You are an evaluation assistant. Please determine if the model output is equivalent to the \
labeled answer.
Question: {question}
Labeled Answer: {labeled_answer}
Model Output: {pred_answer}
Did the model give an answer equivalent to the labeled answer? Please respond with "Correct" if they are \
equivalent, or "Incorrect" if they are not equivalent. Do not include any other text."""

HIRA_WEBWALKER = """You are an evaluation assistant. Please determine if the predicted answer is equivalent to \
the labeled answer in terms of core content.
Question: {question}
Labeled Answer: {labeled_answer}
Predicted Answer: {pred_answer}
Evaluation Guidelines:
1. Mark as "Correct" if the predicted answer contains all key information from the labeled answer, even if it \
provides additional details
2. Mark as "Correct" if the predicted answer matches the core meaning of the labeled answer, regardless of \
different phrasing
3. Only mark as "Incorrect" if the predicted answer misses critical information or contains incorrect \
information

Please respond with only "Correct" or "Incorrect". Do not include any other text."""

# RECONSTRUCTED, NOT VERBATIM. MAS-Orchestra's judge (its repo; the paper prints no judge prompt): the notes
# (section 2.5) quote it only in part, with elisions, and give its output as <correct>yes|no</correct>. The
# elided parts are filled in from HLE's prompt, which the quoted parts follow word for word; the last line
# asking for the tag is ours. As quoted, the judge sees no question.
MAS_ORCHESTRA = """Judge whether the following [response] is correct or not based on the precise and \
unambiguous [correct_answer] below.

[response]: {response}

[correct_answer]: {correct_answer}

correct: Answer 'yes' if [response] matches the [correct_answer] given above, or is within a small margin of \
error for numerical problems. Answer 'no' otherwise, i.e. if there is any inconsistency, ambiguity, \
non-equivalency, or if the response is incorrect.

Give your answer as <correct>yes</correct> or <correct>no</correct>."""

JUDGE_PROMPTS: dict[str, JudgePrompt] = {
    "hle": JudgePrompt(HLE, parse_hle, 512, "HLE official judge (MARS App. E.3)"),
    "simpleqa": JudgePrompt(SIMPLEQA, parse_simpleqa, 2, "SimpleQA grader (MATPO appendix)"),  # 2: MATPO's
    "hira_qa": JudgePrompt(HIRA_QA, parse_hira, 16, "HiRA normal QA instruction"),
    "hira_webwalker": JudgePrompt(HIRA_WEBWALKER, parse_hira, 16, "HiRA WebWalker instruction"),
    "mas_orchestra": JudgePrompt(
        MAS_ORCHESTRA, parse_mas_orchestra, 512, "MAS-Orchestra judge (reconstructed)"
    ),
}


class LLMJudge:
    """Judges responses with one of ``JUDGE_PROMPTS`` (or a ``JudgePrompt``) on any ``Backend``.

    ``retries`` asks again after a backend error or an unreadable reply (the papers retry 3-5 times; at
    temperature 0 a retry only helps against a flaky server).
    """

    def __init__(
        self,
        backend: Backend,
        prompt: str | JudgePrompt = "hle",
        max_tokens: int | None = None,
        temperature: float = 0.0,
        retries: int = 0,
    ):
        if isinstance(prompt, str):
            if prompt not in JUDGE_PROMPTS:
                raise ValueError(f"unknown judge prompt '{prompt}'; known: {', '.join(JUDGE_PROMPTS)}")
            prompt = JUDGE_PROMPTS[prompt]
        self.backend, self.prompt, self.temperature, self.retries = backend, prompt, temperature, retries
        self.max_tokens = max_tokens if max_tokens is not None else prompt.max_tokens

    async def judge(self, question: str, response: str, reference: str) -> Judgement:
        """Judge one response; never raises for the item (errors are recorded, the score is 0.0)."""
        judgement = Judgement(0.0, None, "", "not judged")
        for _ in range(self.retries + 1):
            judgement = await self._judge_once(question, response, reference)
            if judgement.error is None:
                break
        return judgement

    async def _judge_once(self, question: str, response: str, reference: str) -> Judgement:
        text = ""
        try:
            content = self.prompt.render(question, response, reference)
            ids = chat_prompt_ids(self.backend.tokenizer, [{"role": "user", "content": content}])
            request = GenerationRequest(
                prompt_ids=ids, max_tokens=self.max_tokens, temperature=self.temperature
            )
            text = (await self.backend.generate(request))[0].text
            score, verdict = self.prompt.parse(text)
        except UnreadableJudgement as error:
            return Judgement(0.0, None, text, f"unreadable judgement: {error}")
        except Exception as error:  # noqa: BLE001 - one item's failure must not stop the others
            return Judgement(0.0, None, text, f"{type(error).__name__}: {error}")
        return Judgement(min(max(float(score), 0.0), 1.0), verdict, text)

    async def judge_many(self, items: Iterable[tuple[str, str, str]]) -> list[Judgement]:
        """Judge (question, response, reference) items concurrently, in order."""
        return list(await asyncio.gather(*(self.judge(q, r, ref) for q, r, ref in items)))

    def judge_sync(self, question: str, response: str, reference: str) -> Judgement:
        """``judge`` from plain code or a notebook (a running event loop gets its own thread)."""
        return self.judge_many_sync([(question, response, reference)])[0]

    def judge_many_sync(self, items: Iterable[tuple[str, str, str]]) -> list[Judgement]:
        """``judge_many`` from plain code or a notebook (a running event loop gets its own thread)."""
        items = list(items)
        return run_sync(lambda: self.judge_many(items))

    def __repr__(self) -> str:
        return f"LLMJudge({self.prompt.source!r}, backend={getattr(self.backend, 'name', self.backend)!r})"
