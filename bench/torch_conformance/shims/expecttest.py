"""Stand-in for the small `expecttest` package, written for the conformance
harness: PyTorch's test base class (torch.testing._internal.common_utils)
derives from expecttest.TestCase, and the GPU machine has no expecttest.
The harness puts this folder at the END of sys.path, so an installed
expecttest always wins.

It offers what the base class needs: TestCase with assertExpectedInline and
assertExpectedRaisesInline that compare against the expected text (after the
same dedent and strip an inline expectation gets). It never rewrites source
files (no EXPECTTEST_ACCEPT): a mismatch is a plain failure.
"""
import textwrap
import unittest

ACCEPT = False


def _normalize(expect):
    text = textwrap.dedent(expect)
    return text[1:] if text.startswith("\n") else text


def assert_expected_inline(actual, expect, skip=0):
    if actual != _normalize(expect):
        raise AssertionError(f"expected inline text differs:\n--- expected\n{_normalize(expect)}"
                             f"\n--- actual\n{actual}")


class TestCase(unittest.TestCase):
    longMessage = True

    def assertExpectedInline(self, actual, expect, skip=0):
        self.assertMultiLineEqual(_normalize(expect), actual)

    def assertExpectedRaisesInline(self, exc_type, callable_, expect, *args, **kwargs):
        try:
            callable_(*args, **kwargs)
        except exc_type as e:
            self.assertExpectedInline(str(e), expect)
            return
        self.fail(f"{exc_type.__name__} was not raised")
