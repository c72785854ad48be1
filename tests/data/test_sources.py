"""sources.RecordSource's in-memory cache of small local splits: each record is read and parsed once, a caller's
edits never reach the cache, and large splits and bucket streams are read from their files every time."""

from vit_jax.data import sources


class CountingRecords:
    """Wraps a source's raw records and counts the reads of each index."""

    def __init__(self, records) -> None:
        self.records, self.reads = records, {}

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> bytes:
        self.reads[index] = self.reads.get(index, 0) + 1
        return self.records[index]


def counted_source(ds, split: str) -> tuple[sources.RecordSource, CountingRecords]:
    source = sources.RecordSource(ds.builder, split)  # a fresh source, not the dataset's shared one
    counter = source._records = CountingRecords(source._records)
    return source, counter


def test_a_small_local_split_is_read_and_parsed_once_and_edits_do_not_reach_the_cache(digits_ds):
    source, counter = counted_source(digits_ds, "train[:10%]")
    first = [source[i] for i in range(len(source))]
    first[0]["label"] = -7
    first[0]["extra"] = b"edited"
    again = [source[i] for i in range(len(source))]
    assert counter.reads == {i: 1 for i in range(len(source))}
    assert again[0]["label"] != -7 and "extra" not in again[0]
    assert again[1:] == first[1:]
    # the cached examples are those a source without a cache parses
    uncached, _ = counted_source(digits_ds, "train[:10%]")
    uncached._cache = None
    assert again == [uncached[i] for i in range(len(uncached))]


def test_a_split_over_the_cache_budget_is_read_from_its_files_every_time(digits_ds, monkeypatch):
    monkeypatch.setattr(sources, "CACHE_BYTES", 1000)  # the digits' train files hold more
    source, counter = counted_source(digits_ds, "train")
    for _ in range(2):
        source[5]
    assert counter.reads == {5: 2}


def test_records_handed_in_such_as_a_bucket_stream_are_never_cached(digits_ds):
    local = sources.RecordSource(digits_ds.builder, "test")
    counter = CountingRecords(local._records)
    streamed = sources.RecordSource(digits_ds.builder, "test", records=counter)
    assert streamed[3] == streamed[3] == local[3]
    assert counter.reads == {3: 2}
