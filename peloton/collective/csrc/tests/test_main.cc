// The C++ unit tests of the collective runtime (doctest). Built by `python setup.py
// build_cpp_tests` and run by tests/test_collective_cpp.py (so by `make test`).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "doctest/doctest.h"
