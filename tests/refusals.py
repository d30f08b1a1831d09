"""Ways a student hands in a course-library function as their own, for the tests that show each
lab check refusing them (tests/test_exercises_week0N.py). Every wrapper ends in a call of the
library function, which is what the checks watch (infer.course.grading.checks.LibraryCalls)."""

import functools
import sys

from infer.course.grading.checks import library_origin


def wrapped_function(function, kind: str):
    """`function` handed in as `kind`: a lambda, a def, functools.partial, or a getattr on its module."""
    module, name = sys.modules[function.__module__], function.__name__
    if kind == "lambda":
        return lambda *args, **kwargs: function(*args, **kwargs)
    if kind == "def":

        def mine(*args, **kwargs):
            return function(*args, **kwargs)

        return mine
    if kind == "partial":
        return functools.partial(function)
    if kind == "getattr":
        return lambda *args, **kwargs: getattr(module, name)(*args, **kwargs)
    raise ValueError(kind)


FUNCTION_WRAPPERS = ("lambda", "def", "partial", "getattr")


def wrapped_class(cls, kind: str):
    """A library class handed in as `kind`: a factory, a lambda, a subclass, a type() copy, a
    delegating wrapper, a __getattr__ proxy, or a class whose __new__ returns the library's."""
    if kind == "factory":

        def make(*args, **kwargs):
            return cls(*args, **kwargs)

        return make
    if kind == "lambda":
        return lambda *args, **kwargs: cls(*args, **kwargs)
    if kind == "subclass":
        return type("Mine", (cls,), {})
    if kind == "type copy":
        return type("Mine", (), dict(vars(cls)))
    if kind == "delegating":

        class Delegating:
            def __init__(self, *args, **kwargs):
                self.inner = cls(*args, **kwargs)

            def write(self, *args):
                return self.inner.write(*args)

            def read(self, *args):
                return self.inner.read(*args)

        return Delegating
    if kind == "proxy":

        class Proxy:
            def __init__(self, *args, **kwargs):
                self.inner = cls(*args, **kwargs)

            def __getattr__(self, name):
                return getattr(self.inner, name)

        return Proxy
    if kind == "__new__":

        class Handout:
            def __new__(klass, *args, **kwargs):
                return cls(*args, **kwargs)

        return Handout
    raise ValueError(kind)


CLASS_WRAPPERS = ("factory", "lambda", "subclass", "type copy", "delegating", "proxy", "__new__")


def assert_refused(verdict, library_object) -> None:
    """The check failed, and its line names the library object."""
    name = library_origin(library_object)
    assert not verdict.ok and name in verdict.line and "course library's own" in verdict.line, (name, verdict.line)
