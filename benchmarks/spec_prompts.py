"""The prompts of ``benchmarks/speculative.py`` (chat turns for an instruct model; every
text here was written for kvsim). Two are tasks where the answer repeats the prompt, so
prompt lookup has something to find: a passage summarised with quotes and a code edit."""

PASSAGE = (
    "The lighthouse on Gull Point was built in 1871 from granite cut on the island itself. "
    "For ninety years a keeper climbed its hundred and twelve steps every evening to light "
    "the lamp. \"The sea does not forgive a dark night,\" the first keeper wrote in his log. "
    "In 1962 the lamp was automated, and the keeper's cottage became a small museum where "
    "visitors can still read that log."
)

CODE = '''def total(prices, tax):
    result = 0
    for p in prices:
        result = result + p
    result = result * (1 + tax)
    return result
'''

PROMPTS = {
    "summary-quotes": f"{PASSAGE}\n\nSummarise this passage in two sentences and quote the "
                      f"keeper's words exactly.",
    "code-edit": f"{CODE}\nRename the function total to sum_prices and the variable result "
                 f"to amount. Return the whole function.",
    "repeat": f"Repeat the following text exactly, word for word:\n\n{PASSAGE}",
    "qa": "Why is the sky blue? Answer in a few sentences.",
    "story": "Write a short story about a robot who learns to paint.",
    "list": "List five fruits and say one thing about each.",
}
