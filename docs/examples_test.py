"""README.md and docs/*.md against the tree, with no GPU, torch or CuPy.

The C++ examples are compiled and run by //docs:<name>_example (docs/BUILD);
here: every C++ block is one of those, every Python block parses and names
only what integrations/python/cma defines (read as source, not imported), the
same for `cma.x` names in the prose, and the commands, links and repository
paths the pages name exist.
"""
import glob
import os
import re
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import md_examples  # noqa: E402

RUNFILES = os.path.dirname(HERE)
PAGES = [os.path.join(RUNFILES, "README.md")] + sorted(glob.glob(os.path.join(HERE, "*.md")))
# Runfiles are links into the source tree: its root, for the paths the pages
# name (they are too many to declare as data: bench/results/ alone).
SOURCE = os.path.dirname(os.path.realpath(PAGES[0]))


def _rel(path):
    return os.path.relpath(path, RUNFILES)


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


BLOCKS = [b for p in PAGES for b in md_examples.blocks(_rel(p), _read(p))]
PACKAGE = md_examples.Package(os.path.join(RUNFILES, "integrations", "python", "cma"))


def _compiled_examples():
    m = re.search(r"^EXAMPLES = \[(.*?)\]", _read(os.path.join(HERE, "BUILD")), re.S | re.M)
    return set(re.findall(r'"(\w+)"', m.group(1)))


def _code_spans(text):
    """Inline code of the prose (fenced blocks left out)."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.findall(r"`([^`\n]+)`", prose)


def test_the_pages_were_found():
    names = {_rel(p) for p in PAGES}
    assert "README.md" in names and "docs/cpp_api.md" in names, names
    assert any(b.lang == "cpp" for b in BLOCKS) and any(b.lang == "python" for b in BLOCKS)


def test_every_cpp_block_is_compiled_and_run():
    compiled = _compiled_examples()
    named = [b.attrs.get("example") for b in BLOCKS if b.lang == "cpp"]
    for b in BLOCKS:
        if b.lang == "cpp":
            assert b.attrs.get("example") in compiled, (
                "%s: a ```cpp block needs example=NAME, NAME in docs/BUILD's EXAMPLES" % b.where())
            md_examples.cc_chain(b.attrs["example"], BLOCKS)  # its after= exists
    assert len(named) == len(set(named)), "two C++ blocks share a name: %s" % named
    assert compiled == set(named), "EXAMPLES names no block: %s" % (compiled - set(named))


def test_the_generated_program_hoists_includes_and_runs_the_chain():
    page = "```cpp example=a\n#include \"x.h\"\nint i = 1;\n```\n```cpp example=b after=a\ni++;\n```\n"
    every = md_examples.blocks("p.md", page)
    program = md_examples.cc_program("b", every)
    assert program.index('#include "x.h"') < program.index("int main()")
    assert program.index("int i = 1;") < program.index("i++;")
    assert '#line 2 "p.md"' in program and '#line 6 "p.md"' in program
    with pytest.raises(KeyError):
        md_examples.cc_program("c", every)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang == "python"],
                         ids=lambda b: b.where())
def test_python_block_parses_and_names_what_exists(block):
    names = md_examples.python_names(block.code)
    assert names, "%s: names nothing under cma" % block.where()
    missing = [m for m in map(PACKAGE.resolve, sorted(names)) if m]
    assert not missing, "%s: %s" % (block.where(), missing)


def test_the_resolver_refuses_what_is_not_there():
    assert PACKAGE.resolve("cma.torch.symmetric.empty") is None
    assert PACKAGE.resolve("cma.torch.no_such_function") is not None
    assert PACKAGE.resolve("cma.no_such_module") is not None
    assert md_examples.python_names("import cma.symmetric as s\ns.free(b)\n") >= {"cma.symmetric.free"}


def test_cma_names_in_the_prose_exist():
    missing = []
    for p in PAGES:
        for span in _code_spans(_read(p)):
            for name in re.findall(r"(?<![\w/.])cma(?:\.[A-Za-z_]\w*)+", span):
                why = PACKAGE.resolve(name)
                if why:
                    missing.append("%s: `%s`: %s" % (_rel(p), span, why))
    assert not missing, "\n".join(missing)


def test_shell_blocks_run_scripts_that_exist():
    for b in BLOCKS:
        if b.lang != "sh":
            continue
        for line in b.code.splitlines():
            words = line.split("#")[0].split()
            if words and "/" in words[0] and not words[0].startswith("bazel-"):
                assert os.path.isfile(os.path.join(SOURCE, words[0])), "%s: %s" % (b.where(), line)


def test_links_and_repository_paths_exist():
    assert os.path.isfile(os.path.join(SOURCE, "WORKSPACE")), "source tree not found from " + SOURCE
    top = ("allocator", "backends", "bench", "docs", "fuzz", "integrations", "policy", "tests")
    missing = []
    for p in PAGES:
        text, page_dir = _read(p), os.path.dirname(os.path.join(SOURCE, _rel(p)))
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" not in target and not os.path.exists(os.path.join(page_dir, target)):
                missing.append("%s: link %s" % (_rel(p), target))
        for span in _code_spans(text):
            if span.split("/")[0] in top and not re.search(r"[\s<*]", span):
                if not os.path.exists(os.path.join(SOURCE, span)):
                    missing.append("%s: path %s" % (_rel(p), span))
    assert not missing, "\n".join(missing)


if __name__ == "__main__":
    args = [__file__, "-q", "-p", "no:cacheprovider"]
    if os.environ.get("XML_OUTPUT_FILE"):
        args += ["--junitxml", os.environ["XML_OUTPUT_FILE"]]
    sys.exit(pytest.main(args))
