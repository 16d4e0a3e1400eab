from gsrun.base.cpulist import format_cpulist, parse_cpulist, words_to_cpus


def test_cpulist_roundtrip():
    assert parse_cpulist("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert format_cpulist([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    assert words_to_cpus([0xFFFF, 0]) == list(range(16))


def test_subpackages_map_to_folders():
    import gsrun.prolog
    assert gsrun.prolog.__file__.endswith("prolog/__init__.py")
