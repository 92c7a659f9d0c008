"""Build the self-distillation data for the default model's exit heads: its own greedy chat answers
(the shipped asset `assets/data/smollm2-135m-instruct-chat-answers.jsonl.gz`; assets/data/README.md
holds the commands that built it).

    python tools/build_chat_data.py --out runs/chat-data/answers.jsonl --minutes 30

Prompts are made here from templates and seeded word lists (code, prose, maths, everyday
questions); none of them is one of the held-out evaluation prompts (assets/prompts/chat.json) or
the page's examples (assets/prompts/examples.json), which is checked. Each prompt goes through
the model's chat template and is answered greedily by Hugging Face `generate()` in batches (the
same answers the page shows by default). One JSON line per answer: {"category", "prompt",
"temperature", "prompt_ids", "answer_ids"}. Appends, and skips prompts already answered at that
temperature, so a run can be resumed or extended; with `--temperature 0.8` it adds a sampled
answer per prompt. Not part of the library: `python -m ppsd train-head` reads what it writes.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.page_text import PROMPTS as EXAMPLES  # noqa: E402
from ppsd.bench.prompts import CHAT_PROMPTS_FILE  # noqa: E402
from ppsd.chat import encode_prompt  # noqa: E402
from ppsd.heads.data import open_jsonl  # noqa: E402
from ppsd.model import load_model  # noqa: E402
from ppsd.model_source import DEFAULT_MODEL  # noqa: E402

HELDOUT = (CHAT_PROMPTS_FILE, EXAMPLES)  # the benchmark's questions and the page's examples: never trained on

CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "returns the factorial of n",
    "counts the vowels in a sentence", "finds the largest number in a list", "merges two sorted lists",
    "removes duplicates from a list while keeping the order", "checks whether a word is a palindrome",
    "converts Celsius to Fahrenheit", "returns the n-th Fibonacci number iteratively",
    "computes the greatest common divisor of two numbers", "flattens a nested list",
    "counts how often each word appears in a text", "sorts a list of dictionaries by a key",
    "reads a text file and returns its lines", "checks whether two strings are anagrams",
    "computes the average of a list of numbers", "returns the second largest element of a list",
    "capitalizes the first letter of every word", "converts a binary string to an integer",
    "generates all subsets of a list", "implements binary search on a sorted list",
    "computes the sum of the digits of a number", "transposes a matrix given as a list of lists",
    "validates an email address with a regular expression", "returns the median of a list",
    "rotates a list by k positions", "finds the longest word in a sentence",
    "checks whether a year is a leap year", "computes the power set of a string's characters",
    "implements a simple stack class", "implements a queue using two stacks",
    "counts the lines in a CSV file", "returns the intersection of two lists",
    "computes compound interest", "converts a Roman numeral to an integer",
    "draws a triangle of stars of height n", "finds all even numbers in a range",
    "computes the dot product of two vectors", "returns the unique characters of a string",
]
CODE_LANGUAGES = ["Python", "Python", "Python", "JavaScript", "C", "Java", "Rust", "Go"]
CODE_QUESTIONS = [
    "What is the difference between a list and a tuple in Python?", "What does the `yield` keyword do?",
    "How do I read a JSON file in Python?", "What is recursion? Give an example.",
    "What is a hash table and why is it fast?", "How do I handle exceptions in Python?",
    "What is the difference between `==` and `is` in Python?", "What is a class in object-oriented programming?",
    "How does a for loop work in JavaScript?", "What is Big O notation?",
    "How do I install a package with pip?", "What is a variable in programming?",
    "What does an API do?", "How do I create a virtual environment in Python?",
    "What is the difference between a compiler and an interpreter?", "What is Git used for?",
    "How do I sort a dictionary by value in Python?", "What is a lambda function?",
    "What is SQL used for?", "How do I reverse a list in Python?",
]
CONCEPTS = [
    "photosynthesis", "gravity", "the water cycle", "how vaccines work", "inflation", "black holes",
    "the theory of evolution", "how the internet works", "machine learning", "climate change",
    "the immune system", "electricity", "how airplanes fly", "the French Revolution", "democracy",
    "supply and demand", "DNA", "the solar system", "earthquakes", "the greenhouse effect",
    "how a computer works", "the stock market", "volcanoes", "the human heart", "magnetism",
    "the Roman Empire", "renewable energy", "how rainbows form", "the moon's phases", "atoms",
    "the scientific method", "plate tectonics", "nuclear energy", "the seasons", "sound waves",
    "how batteries work", "the printing press", "antibiotics", "the Industrial Revolution", "tides",
    "the speed of light", "how bees make honey", "cloud computing", "the Pythagorean theorem",
    "blockchain", "the digestive system", "why leaves change color", "how a refrigerator works",
    "artificial intelligence", "the Great Wall of China", "how the brain stores memories", "recycling",
]
AUDIENCES = ["in simple terms", "to a ten-year-old", "in two sentences", "with an example", "briefly"]
TOPICS = [
    "the ocean", "autumn", "a cat", "friendship", "the city at night", "mountains", "coffee", "rain",
    "the stars", "a garden", "winter", "the sea", "a train journey", "a library", "music", "a forest",
    "the sun", "a lighthouse", "home", "courage",
]
FORMS = ["a short poem about", "a haiku about", "a short story about", "a paragraph describing",
         "a limerick about", "a product description for a mug about"]
ACTIVITIES = [
    "staying focused while studying", "sleeping better", "learning a new language", "saving money",
    "cooking at home", "running a first 5k", "reducing stress", "making friends in a new city",
    "keeping a plant alive", "preparing for a job interview", "writing a good essay", "staying hydrated",
    "traveling on a budget", "organizing a small kitchen", "starting to exercise", "public speaking",
    "reading more books", "working from home", "taking better photos", "being more productive",
]
DISHES = ["pancakes", "a tomato soup", "scrambled eggs", "a simple salad", "banana bread", "fried rice",
          "a cup of tea", "guacamole", "a smoothie", "pasta with garlic and oil", "an omelette", "hummus"]
COUNTRIES = ["France", "Japan", "Brazil", "Canada", "Egypt", "Australia", "India", "Kenya", "Mexico",
             "Norway", "Italy", "Argentina", "Germany", "Spain", "China", "Peru", "Greece", "Turkey"]
EVERYDAY = [
    "Why is the sky blue?", "How many days are in a leap year?", "What is a healthy breakfast?",
    "How do I tie a tie?", "Why do cats purr?", "What should I pack for a beach trip?",
    "How do I write a polite email to my teacher?", "What are some fun things to do on a rainy day?",
    "How long should I boil an egg?", "Why do we need sleep?", "How can I be a better listener?",
    "What is the tallest mountain in the world?", "How do I remove a coffee stain?",
    "What are the planets in our solar system?", "Suggest a name for a pet goldfish.",
    "How do I make my room less messy?", "Why do onions make you cry?", "What is a good gift for a friend?",
    "How do I change a flat bicycle tire?", "What are the primary colors?", "Why is exercise good for you?",
    "How do I start a journal?", "What is the difference between weather and climate?",
    "How many continents are there?", "What should I do if I feel lonely?",
]


PAIRS = [("weather", "climate"), ("a virus", "bacteria"), ("a list", "a set"), ("speed", "velocity"),
         ("mass", "weight"), ("RAM", "storage"), ("a comet", "an asteroid"), ("a simile", "a metaphor"),
         ("an alligator", "a crocodile"), ("HTTP", "HTTPS"), ("a lake", "a pond"), ("baking soda", "baking powder"),
         ("a democracy", "a monarchy"), ("a star", "a planet"), ("frogs", "toads"), ("an ocean", "a sea"),
         ("a noun", "a verb"), ("AC", "DC current"), ("a debit card", "a credit card"), ("a moth", "a butterfly")]
EVENTS = ["the Moon landing", "the fall of the Berlin Wall", "the invention of the telephone", "the Renaissance",
          "the discovery of penicillin", "the first Olympic Games", "the building of the pyramids",
          "the Wright brothers' first flight", "the invention of the World Wide Web", "the Black Death",
          "the voyage of Columbus", "the signing of the Magna Carta", "the end of World War II",
          "the first vaccine", "the Gold Rush", "the invention of writing"]
RECIPIENTS = ["my landlord", "a new colleague", "my manager", "a customer", "my teacher", "a friend"]
EMAIL_TOPICS = ["a broken heater", "a meeting next week", "a late delivery", "a birthday party",
                "asking for a day off", "thanking them for their help"]
THINGS = ["electric cars", "working from home", "social media", "nuclear power", "homeschooling",
          "living in a big city", "online shopping", "public transport", "solar panels", "video games",
          "eating less meat", "learning to code", "owning a dog", "remote learning", "fast food"]
PHRASES = ["Good morning", "Where is the train station?", "Thank you very much", "I like to read books",
           "How much does this cost?", "The weather is nice today", "See you tomorrow", "I am hungry"]
LANGUAGES = ["French", "Spanish", "German"]
LISTS = ["fruits that are high in vitamin C", "animals that live in the ocean", "famous painters",
         "board games for families", "programming languages", "musical instruments", "healthy snacks",
         "countries in Africa", "things to do in the summer", "common kitchen tools", "birds",
         "renewable energy sources", "famous scientists", "rivers in Europe", "vegetables that grow fast"]
DEVICES = ["microwave", "thermometer", "compass", "camera", "smartphone", "washing machine", "bicycle",
           "light bulb", "solar panel", "wind turbine", "3D printer", "GPS receiver", "toaster", "telescope"]
PEOPLE = ["Marie Curie", "Albert Einstein", "Leonardo da Vinci", "Ada Lovelace", "Isaac Newton",
          "Nelson Mandela", "Cleopatra", "Charles Darwin", "Frida Kahlo", "Galileo Galilei", "Alan Turing",
          "Mahatma Gandhi", "William Shakespeare", "Nikola Tesla", "Jane Austen", "Wolfgang Amadeus Mozart"]
SNIPPETS = ["print(sum(range(5)))", "print('abc'[::-1])", "print(len([1, [2, 3], 4]))", "print(3 * 'ha')",
            "print(10 // 3, 10 % 3)", "print(sorted([3, 1, 2]))", "print({1, 2, 2, 3})",
            "print([x * x for x in range(4)])", "print('a,b,c'.split(','))", "print(2 ** 10)"]
SQL = ["finds all customers from Berlin", "counts the orders per customer", "lists the ten most expensive products",
       "finds employees hired after 2020", "computes the average salary per department",
       "deletes rows with a missing email", "joins orders with customers"]


def more_prompts(rng: random.Random) -> list[tuple[str, str]]:
    """The second round of templates (a separate generator, so the first round stays as it was)."""
    prompts = [("prose", f"Explain the difference between {a} and {b}.") for a, b in PAIRS]
    prompts += [("prose", f"Summarize {e} in one paragraph.") for e in EVENTS]
    prompts += [("prose", f"Write a short email to {r} about {t}.") for r in RECIPIENTS
                for t in rng.sample(EMAIL_TOPICS, 3)]
    prompts += [("everyday", f"What are the pros and cons of {t}?") for t in THINGS]
    prompts += [("everyday", f"Translate '{p}' into {lang}.") for p in PHRASES for lang in LANGUAGES]
    prompts += [("everyday", f"List five {item}.") for item in LISTS]
    prompts += [("prose", f"How does a {d} work?") for d in DEVICES]
    prompts += [("prose", f"Who was {p} and why are they famous?") for p in PEOPLE]
    prompts += [("code", f"What does this Python code print? `{c}`") for c in SNIPPETS]
    prompts += [("code", f"Write a SQL query that {q}.") for q in SQL]
    prompts += [("prose", f"Give an everyday example of {c}.") for c in rng.sample(CONCEPTS, 20)]
    return prompts + math_prompts(rng, 200)


def math_prompts(rng: random.Random, count: int) -> list[tuple[str, str]]:
    out = []
    for _ in range(count):
        a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 20)
        out.append(("math", rng.choice([
            f"What is {a} + {b}?", f"What is {a} times {c}?", f"What is {a * c} divided by {c}?",
            f"What is {a} minus {b}?", f"Solve for x: {c}x + {a} = {c * b + a}.",
            f"A shop sells pens for {c} dollars each. How much do {b} pens cost?",
            f"I have {a} apples and give away {min(a, b) // 2}. How many are left?",
            f"What is {c} percent of {a * 10}?", f"What is the area of a rectangle {a} cm by {c} cm?",
            f"A train travels at {a} km/h for {c} hours. How far does it go?",
            f"Is {a} a prime number?", f"What is the square of {a}?",
            f"Tom is {a} years old and his sister is {c} years younger. How old is she?",
            f"Round {a}.{b} to the nearest whole number.", f"What is the perimeter of a square with side {c}?",
        ])))
    return out


def training_prompts(seed: int) -> list[tuple[str, str]]:
    """(category, prompt) pairs, shuffled; deterministic for a seed."""
    rng = random.Random(seed)
    prompts = [("code", f"Write a {language} function that {task}.") for task in CODE_TASKS
               for language in rng.sample(CODE_LANGUAGES[2:], 3)]
    prompts += [("code", f"Write a Python function that {task}. Explain it briefly.") for task in CODE_TASKS]
    prompts += [("code", q) for q in CODE_QUESTIONS]
    prompts += [("prose", f"Explain {c} {audience}.") for c in CONCEPTS for audience in rng.sample(AUDIENCES, 3)]
    prompts += [("prose", f"What is {c}?") for c in CONCEPTS]
    prompts += [("prose", f"Write {form} {topic}.") for form in FORMS for topic in TOPICS]
    prompts += [("everyday", f"{lead} {a}.") for a in ACTIVITIES
                for lead in ("Give me three tips for", "What are common mistakes when", "Make a simple plan for")]
    prompts += [("everyday", f"How do I make {d}?") for d in DISHES]
    prompts += [("everyday", f"What is the capital of {c}? Tell me one fact about it.") for c in COUNTRIES]
    prompts += [("everyday", f"What is {c} famous for?") for c in COUNTRIES]
    prompts += [("everyday", q) for q in EVERYDAY]
    prompts += math_prompts(rng, 300)
    unique = list(dict.fromkeys(prompts))
    rng.shuffle(unique)
    second = [p for p in dict.fromkeys(more_prompts(random.Random(seed + 1))) if p not in set(unique)]
    random.Random(seed + 2).shuffle(second)
    return unique + second


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSONL file (appended)")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--minutes", type=float, default=30.0, help="stop starting batches after this")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0, help="prompt lists and, when sampling, the sampler")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="0: greedy answers (default); > 0: sampled ones, a second answer per prompt")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    heldout = {e["prompt"] for path in HELDOUT for e in json.loads(path.read_text())}
    prompts = training_prompts(args.seed)
    overlap = heldout & {p for _, p in prompts}
    if overlap:
        raise SystemExit(f"training prompts overlap the held-out ones: {sorted(overlap)[:3]}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    if out.is_file():
        with open_jsonl(out) as lines:
            rows = [json.loads(line) for line in lines if line.strip()]
    done = {r["prompt"] for r in rows if r.get("temperature", 0.0) == args.temperature}
    todo = [(c, p) for c, p in prompts if p not in done]
    torch.manual_seed(args.seed)
    print(f"{len(prompts)} prompts, {len(done)} answered already, {len(todo)} to go", flush=True)
    model, tokenizer = load_model(args.model)
    hf = model.hf_model
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else model.info.eos_token_ids[0]
    began, tokens = time.perf_counter(), 0
    for start in range(0, len(todo), args.batch_size):
        if time.perf_counter() - began > args.minutes * 60:
            break
        batch = todo[start: start + args.batch_size]
        encoded = [encode_prompt(tokenizer, p, chat=True) for _, p in batch]
        width = max(map(len, encoded))
        ids = torch.tensor([[pad] * (width - len(e)) + e for e in encoded])  # left padding
        mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])
        with torch.inference_mode():
            sampling = dict(do_sample=True, temperature=args.temperature, top_p=1.0, top_k=0) \
                if args.temperature > 0 else dict(do_sample=False)
            generated = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=args.max_new_tokens,
                                    pad_token_id=pad, **sampling)
        with open_jsonl(out, "a") as sink:
            for (category, prompt), prompt_ids, row in zip(batch, encoded, generated[:, width:].tolist()):
                answer = row
                for stop in model.info.eos_token_ids:  # keep the EOS itself: the model must learn to stop
                    if stop in answer:
                        answer = answer[: answer.index(stop) + 1]
                tokens += len(answer)
                sink.write(json.dumps({"category": category, "prompt": prompt, "temperature": args.temperature,
                                       "prompt_ids": prompt_ids, "answer_ids": answer}) + "\n")
        elapsed = time.perf_counter() - began
        print(f"{start + len(batch)}/{len(todo)} prompts, {tokens} answer tokens, "
              f"{tokens / elapsed:.1f} tok/s, {elapsed / 60:.1f} min", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
