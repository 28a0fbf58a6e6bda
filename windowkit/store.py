"""An opened store: metadata, window index, random access and readers."""

from __future__ import annotations

import os
import threading
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from windowkit.errors import (
    InvalidSpecError,
    StoreReplacedError,
    check_int,
)
from windowkit.formats import RowReader
from windowkit.guard import StoreGuard
from windowkit.index import IndexLimits, WindowRuns, index_positions
from windowkit.layout import RowLayout
from windowkit.location import resolve
from windowkit.manifest import Manifest, SplitEntry, Statistics
from windowkit.readers import (
    DEFAULT_CACHE_BYTES,
    BatchOptions,
    ReadPlan,
    ShardOptions,
    ShuffleOptions,
    StoreAccess,
    WindowGather,
    check_budget,
    default_memory_budget,
)
from windowkit.series_table import SeriesTable
from windowkit.spec import WindowSpec
from windowkit.split_index import SplitIndexes
from windowkit.stats import Normalizer

if TYPE_CHECKING:
    import tensorflow as tf

    from windowkit.readers.grain import BatchGrainSource, WindowGrainSource
    from windowkit.readers.keras import WindowPyDataset
    from windowkit.readers.torch import WindowTorchDataset

Windows = Any  # x, (x, y), or with fields a dict x: see windowkit.readers.numpy_engine.fields


def open_store(path: str | os.PathLike[str], *,
               storage_options: dict[str, Any] | None = None) -> Store:
    """Open a store of any format: a local directory, or a URL fsspec
    understands (``s3://bucket/store``; ``storage_options`` go to its
    filesystem, as in pandas and zarr).

    The store is read as untrusted input: its manifest is validated first
    (types, ranges, paths inside the store, each file leading to a regular
    file: links are followed, every block checked against its digest), and
    opening never writes."""
    return Store(resolve(path, storage_options))


class Store:
    """A windowkit store on disk. Cheap to open; pickles (no open handles).

    Readers notice when the store is replaced while they read it (e.g. by
    ``convert --overwrite``) and raise :class:`windowkit.StoreReplacedError`,
    in this process and in worker processes, which check the store id when
    they open it again.
    """

    def __init__(self, path: Path, *, expected_id: str | None = None) -> None:
        self.path = resolve(path)
        self.manifest = Manifest.read(self.path)
        if expected_id is not None and self.manifest.store_id != expected_id:
            raise StoreReplacedError(
                f"{self.path}: the store was replaced while it was being read (opened as "
                f"store id {expected_id[:12]}, now {self.manifest.store_id[:12]}); "
                "open it again")
        self.root = self.manifest.data_root(self.path)  # where its files are
        self.guard = StoreGuard(self.path, self.manifest.store_id)
        self._lock = threading.Lock()
        self._gather: WindowGather | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "store_id": self.manifest.store_id}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], expected_id=state["store_id"])  # type: ignore[misc]

    def __repr__(self) -> str:
        m = self.manifest
        return (f"<windowkit.Store {str(self.path)!r} format={m.format} dtype={m.dtype} "
                f"step_shape={m.step_shape} splits={self.splits}>")

    # -- metadata ---------------------------------------------------------------------
    @property
    def info(self) -> dict[str, Any]:
        """The manifest as a plain dict."""
        return self.manifest.to_dict()

    @property
    def spec(self) -> WindowSpec:
        return self.manifest.spec

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.manifest.dtype)

    @property
    def step_shape(self) -> tuple[int, ...]:
        return self.manifest.step_shape

    def _positions(self, names: list[str] | None) -> np.ndarray | None:
        """Positions of the columns ``names`` among the store's columns (None: none)."""
        columns = self.manifest.columns
        if not names or not columns:
            return None
        return np.array([columns.index(name) for name in names], dtype=np.int64)

    @cached_property
    def target_positions(self) -> np.ndarray | None:
        """Positions of the target columns among the columns (None: y has every column)."""
        return self._positions(self.manifest.target_columns)

    @cached_property
    def known_positions(self) -> np.ndarray | None:
        """Positions of the known-future columns among the columns (None: none)."""
        return self._positions(self.manifest.known_columns)

    @cached_property
    def static_values(self) -> np.ndarray | None:
        """``[series, S]`` float64: each series' static features (None: none)."""
        return self._series.static_values()

    @property
    def splits(self) -> list[str]:
        return list(self.manifest.splits)

    def _split(self, split: str) -> SplitEntry:
        if split not in self.manifest.splits:
            raise InvalidSpecError(
                f"split {split!r} is not in store {self.path}; splits: {', '.join(self.splits)}"
            )
        return self.manifest.splits[split]

    def num_windows(self, split: str = "train") -> int:
        return self._split(split).windows

    @cached_property
    def _series(self) -> SeriesTable:
        return SeriesTable(self.root, self.manifest, self.guard)

    @property
    def series_table(self) -> Any:
        """``series.parquet`` as a pyarrow Table (one row per series: ``series``,
        ``key``, ``rows``, ``row_offset``, ``windows``, each split's row range
        and the static features), checked against the manifest."""
        return self._series.table

    def split_rows(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """Per series, the first row and the end of the rows the windows of
        ``split`` lie in (``series.parquet``)."""
        self._split(split)
        return self._series.split_rows(split)

    # -- the window index -------------------------------------------------------------
    @cached_property
    def _indexes(self) -> SplitIndexes:
        return SplitIndexes(self.root, self.manifest, self._series, self.guard)

    def index(self, split: str = "train") -> np.ndarray:
        """The split's window index table as an ``[n, 3]`` int64 array
        ``(series, start, length)``, each entry checked. This loads one entry
        per window; readers use :meth:`runs`."""
        self._split(split)
        return self._indexes.table(split)

    def index_limits(self, split: str) -> IndexLimits:
        """What each entry of ``split``'s index table must satisfy (see
        :class:`windowkit.index.IndexLimits`)."""
        self._split(split)
        return self._indexes.limits(split)

    def runs(self, split: str = "train") -> WindowRuns:
        """The split's windows in compact form (memory grows with series, not
        windows), each index entry checked."""
        self._split(split)
        return self._indexes.runs(split)

    # -- reading windows --------------------------------------------------------------
    @cached_property
    def layout(self) -> RowLayout:
        """The stored rows: dtype, step shape, count and storage blocks."""
        return self.manifest.layout

    @cached_property
    def access(self) -> StoreAccess:
        """The store opened for reading (what every reader starts from)."""
        m = self.manifest
        return StoreAccess(path=self.root, format=m.format, spec=self.spec, layout=self.layout,
                           data=m.data, store_id=m.store_id, statistics=_as_dict(m.normalization),
                           target_positions=self.target_positions,
                           known_positions=self.known_positions, static_values=self.static_values,
                           static_statistics=_as_dict(m.static_statistics), guard=self.guard)

    def read_plan(self, split: str = "train") -> ReadPlan:
        """What a reader needs to read ``split``: the rows and the split's windows
        (a split holding none is an error: a reader would yield nothing)."""
        if self.num_windows(split) == 0:
            raise InvalidSpecError(f"split {split!r} of store {self.path} holds no windows, "
                                   "so there is nothing to read (see windowkit inspect)")
        return ReadPlan(self.access, split=split, runs=self.runs(split))

    def row_reader(self) -> RowReader:
        return self.access.row_reader()

    def window_gather(self, cache_bytes: int = DEFAULT_CACHE_BYTES) -> WindowGather:
        """A new gatherer with its own block cache of ``cache_bytes``."""
        return self.access.window_gather(cache_bytes)

    def normalizer(self) -> Normalizer:
        return self.access.normalizer()

    def windows(self, split: str, positions: Any, *, normalize: bool = False,
                return_series: bool = False) -> Windows:
        """Windows at ``positions`` of the split's index (random access): ``x`` or,
        with a horizon, ``(x, y)``; ``x`` is a dict of fields (``inputs``,
        ``future_known``, ``static``, ``series``) when the store has known-future
        or static columns, or ``return_series`` (see
        :mod:`windowkit.readers.numpy_engine.fields`). ``positions`` index as
        NumPy indexes: integers (negative from the end), a slice or a boolean
        mask; anything else is one line."""
        self._split(split)
        runs = self.runs(split)
        starts, series = runs.global_starts_and_series(index_positions(positions, runs.total))
        with self._lock:
            if self._gather is None:
                self._gather = self.window_gather()
            gather = self._gather
        fields = self.access.fields(return_series)
        x, horizon = gather.cut(starts, fields.horizon_columns(self.target_positions))
        return fields.assemble(x, horizon, series if fields.series else None,
                              targets=self.target_positions,
                              norm=self.access.normalizer() if normalize else None)

    def _reader_plan(self, split: str, shard: ShardOptions) -> ReadPlan:
        """The plan of ``split``, or of one shard of it: a contiguous piece of
        the split's index, within one window of every other shard's."""
        return self.read_plan(split).shard_of(shard.num_shards, shard.shard_index)

    def tf_dataset(self, split: str = "train", batch_size: int = 256, *,
                   shuffle: bool | str = True, seed: int = 0, drop_remainder: bool = False,
                   normalize: bool = False, memory_budget: int | None = None,
                   spill_dir: str | os.PathLike[str] | None = None,
                   num_shards: int | None = None, shard_index: int | None = None,
                   input_context: Any = None, device: str | None = None,
                   service: str | None = None, return_series: bool = False,
                   shuffle_blocks: int | None = None, cache_bytes: int | None = None,
                   epoch: int = 0) -> tf.data.Dataset:
        """A ``tf.data.Dataset`` of batches of windows: ``x``, or ``(x, y)`` with a horizon.

        Every window of the split comes once per epoch; each iteration of the
        dataset read to its end moves on to the next epoch (the first is
        ``epoch``), each epoch's order fixed by ``seed`` and the epoch, as in
        every other reader. An iterator saves and restores with
        ``tf.train.Checkpoint`` (its epoch too). With
        known-future or static columns in the store, or ``return_series``,
        ``x`` is a dict ``{"inputs", "future_known", "static", "series"}``
        (the keys configured).

        :param split: the split to read (``store.splits``).
        :param batch_size: windows per batch (the global batch with ``input_context``).
        :param shuffle: ``True`` (default): the best mixing ``memory_budget``
            allows: each epoch a uniform permutation of the split's windows when
            its rows fit the budget, else block groups as large as it holds;
            ``"global"``: a uniform permutation at any size, the rows beyond the
            budget spilled once to local disk and read by random access;
            ``"blocks"``: block groups; ``False``: index order.
        :param seed: fixes every epoch's order.
        :param drop_remainder: leave out the last, smaller batch of an epoch.
        :param normalize: ``(x - mean) / std`` with the training rows' statistics.
        :param memory_budget: bytes the reader may hold (default: a quarter of
            the available memory, at most 16 GiB).
        :param spill_dir: where a uniform shuffle beyond the budget writes its
            private, unlinked file (default ``$WINDOWKIT_SPILL_DIR``, else the
            temporary directory).
        :param num_shards: read one shard of ``num_shards`` (with ``shard_index``):
            a contiguous piece of the split's index, within one window of every
            other shard's, in the whole split's order of the epoch; every shard
            yields as many batches (one short shard repeats its last window, or
            with ``drop_remainder`` one long shard leaves its last one out).
        :param shard_index: which shard, ``0 .. num_shards - 1``.
        :param input_context: a ``tf.distribute.InputContext``: picks the shard
            and turns the global ``batch_size`` into the replica's.
        :param device: e.g. ``"/GPU:0"``: prefetch batches into that device's memory.
        :param service: a tf.data dispatcher's address (TFRecord stores): the
            split's files are read by the service's workers, each file by one
            worker per epoch, windows mixed in a buffer of ``cache_bytes``.
        :param return_series: add each window's series id to ``x``.
        :param shuffle_blocks: experts: blocks per group (implies block groups).
        :param cache_bytes: experts: bytes of blocks a block group holds
            (implies block groups).
        :param epoch: the epoch the first iteration reads (to go on from a
            known epoch, as ``set_epoch`` does for PyTorch).
        """
        batch = BatchOptions.checked(batch_size, drop_remainder=drop_remainder,
                                     normalize=normalize, return_series=return_series)
        order = ShuffleOptions.checked(shuffle, seed=seed, memory_budget=memory_budget,
                                       spill_dir=spill_dir, cache_bytes=cache_bytes,
                                       shuffle_blocks=shuffle_blocks)
        shard = ShardOptions.checked(num_shards, shard_index, input_context=input_context)
        if input_context is not None:
            try:
                batch = replace(batch, batch_size=int(
                    input_context.get_per_replica_batch_size(batch.batch_size)))
            except ValueError as exc:  # not divisible by the replicas
                raise InvalidSpecError(f"batch_size: {exc}") from None
        plan = self._reader_plan(split, shard)
        from windowkit.readers.tf import tf_dataset

        return tf_dataset(plan, batch, order, device=device, service=service,
                          epoch=check_int("epoch", epoch, 0))

    def keras_dataset(self, split: str = "train", batch_size: int = 256, *,
                      shuffle: bool | str = True, seed: int = 0, drop_remainder: bool = False,
                      normalize: bool = False, workers: int = 1,
                      use_multiprocessing: bool = False, max_queue_size: int = 10,
                      memory_budget: int | None = None,
                      spill_dir: str | os.PathLike[str] | None = None,
                      num_shards: int | None = None, shard_index: int | None = None,
                      return_series: bool = False, cache_bytes: int | None = None
                      ) -> WindowPyDataset:
        """A ``keras.utils.PyDataset`` of batches of windows, a
        :class:`windowkit.readers.keras.WindowPyDataset`: one batch loaded at a
        time, on any Keras backend; pass ``shuffle=False`` to ``fit``.

        :param split: the split to read.
        :param batch_size: windows per batch.
        :param shuffle: as for :meth:`tf_dataset`.
        :param seed: fixes every epoch's order.
        :param drop_remainder: leave out the last, smaller batch of an epoch.
        :param normalize: ``(x - mean) / std`` with the training rows' statistics.
        :param workers: Keras' loader threads or processes.
        :param use_multiprocessing: processes instead of threads.
        :param max_queue_size: batches Keras queues ahead.
        :param memory_budget: as for :meth:`tf_dataset`.
        :param spill_dir: as for :meth:`tf_dataset`.
        :param num_shards: as for :meth:`tf_dataset`.
        :param shard_index: as for :meth:`tf_dataset`.
        :param return_series: add each window's series id to ``x``.
        :param cache_bytes: experts: bytes of blocks cached (implies block groups).
        """
        from windowkit.readers.keras import WindowPyDataset

        batch = BatchOptions.checked(batch_size, drop_remainder=drop_remainder,
                                     normalize=normalize, return_series=return_series)
        order = ShuffleOptions.checked(shuffle, seed=seed, memory_budget=memory_budget,
                                       spill_dir=spill_dir, cache_bytes=cache_bytes)
        plan = self._reader_plan(split, ShardOptions.checked(num_shards, shard_index))
        return WindowPyDataset(plan, batch, order, workers=workers,
                               use_multiprocessing=use_multiprocessing,
                               max_queue_size=max_queue_size)

    def torch_dataset(self, split: str = "train", batch_size: int = 256, *,
                      shuffle: bool | str = True, seed: int = 0, normalize: bool = False,
                      drop_remainder: bool = False, rank: int | None = None,
                      world_size: int | None = None, return_series: bool = False,
                      memory_budget: int | None = None,
                      spill_dir: str | os.PathLike[str] | None = None,
                      cache_bytes: int | None = None) -> WindowTorchDataset:
        """A map-style ``torch.utils.data.Dataset`` whose item ``i`` is batch ``i``
        of the epoch (tensors: ``x``, ``(x, y)``, or dicts of fields), a
        :class:`windowkit.readers.torch.WindowTorchDataset`, for
        ``DataLoader(ds, batch_size=None, num_workers=N)``; call
        ``ds.set_epoch(e)`` before each epoch.

        :param split: the split to read.
        :param batch_size: windows per batch (per rank).
        :param shuffle: as for :meth:`tf_dataset`.
        :param seed: fixes every epoch's order (the same in every worker and rank).
        :param normalize: ``(x - mean) / std`` with the training rows' statistics.
        :param drop_remainder: leave out the last, smaller batch of an epoch.
        :param rank: this process's shard, ``0 .. world_size - 1`` (default:
            ``torch.distributed``'s rank when it is initialized, else 0).
        :param world_size: how many shards (default: ``torch.distributed``'s
            world size when it is initialized, else 1). Each rank owns a
            contiguous piece of the split (as ``num_shards`` does) and yields the
            same number of batches; the dataset's items are every rank's batches,
            interleaved, for a ``DistributedSampler(ds, shuffle=False)`` (which
            Lightning and Accelerate add by default) to split.
        :param return_series: add each window's series id to ``x``.
        :param memory_budget: as for :meth:`tf_dataset` (per process).
        :param spill_dir: as for :meth:`tf_dataset`.
        :param cache_bytes: experts: bytes of blocks cached (implies block groups).
        """
        from windowkit.readers.numpy_engine.batches import EpochBatches
        from windowkit.readers.torch import WindowTorchDataset, distributed_shard

        batch = BatchOptions.checked(batch_size, drop_remainder=drop_remainder,
                                     normalize=normalize, return_series=return_series)
        order = ShuffleOptions.checked(shuffle, seed=seed, memory_budget=memory_budget,
                                       spill_dir=spill_dir, cache_bytes=cache_bytes)
        rank, world_size = distributed_shard(rank, world_size)
        plan = self.read_plan(split).shard_of(world_size, rank)
        return WindowTorchDataset(EpochBatches(plan, batch, order), rank=rank,
                                  world_size=world_size)

    def grain_source(self, split: str = "train", *, normalize: bool = False,
                     return_series: bool = False, memory_budget: int | None = None,
                     spill_dir: str | os.PathLike[str] | None = None) -> WindowGrainSource:
        """A Grain random-access data source of the split's windows, a
        :class:`windowkit.readers.grain.WindowGrainSource`: ``src[i]`` is window
        ``i`` (``x``, ``(x, y)`` or a dict of fields, no batch axis), for
        ``grain.MapDataset.source(src).shuffle(seed=0).batch(B)``.

        :param split: the split to read.
        :param normalize: ``(x - mean) / std`` with the training rows' statistics.
        :param return_series: add each window's series id to ``x``.
        :param memory_budget: bytes of rows held in memory per process (default
            as for :meth:`tf_dataset`); beyond it they are spilled to local disk.
        :param spill_dir: as for :meth:`tf_dataset`.
        """
        from windowkit.readers.grain import WindowGrainSource

        batch = BatchOptions.checked(normalize=normalize, return_series=return_series)
        budget = check_budget("memory_budget", memory_budget)
        return WindowGrainSource(self.read_plan(split), normalize=batch.normalize,
                                 return_series=batch.return_series,
                                 memory_budget=default_memory_budget() if budget is None
                                 else budget, spill_dir=spill_dir)

    def grain_batches(self, split: str = "train", batch_size: int = 256, *,
                      shuffle: bool | str = True, seed: int = 0, epoch: int = 0, epochs: int = 1,
                      drop_remainder: bool = False, normalize: bool = False,
                      return_series: bool = False, memory_budget: int | None = None,
                      num_shards: int | None = None, shard_index: int | None = None,
                      spill_dir: str | os.PathLike[str] | None = None) -> BatchGrainSource:
        """A Grain random-access data source of whole batches, a
        :class:`windowkit.readers.grain.BatchGrainSource`: ``src[i]`` is batch
        ``i`` (NumPy: ``x``, ``(x, y)`` or a dict of fields), the same batch,
        window for window, as :meth:`keras_dataset`'s of that epoch; for
        ``grain.MapDataset.source(src)`` or ``grain.DataLoader(data_source=src,
        ...)``, which then neither shuffle nor batch again. The fast Grain
        source: Grain's cost per element is paid once a batch.

        Grain hands a source indices below its ``len`` only (its own repeats
        read the same items again), so the source holds ``epochs`` epochs one
        after another, each in its own seeded order: item ``i`` is batch
        ``i % src.batches_per_epoch`` of epoch ``epoch + i // src.batches_per_epoch``.

        :param split: the split to read.
        :param batch_size: windows per batch.
        :param shuffle: as for :meth:`tf_dataset`.
        :param seed: fixes every epoch's order.
        :param epoch: the epoch of the first item (to go on from a known epoch).
        :param epochs: how many epochs the source holds, one after another.
        :param drop_remainder: leave out the last, smaller batch of an epoch.
        :param normalize: ``(x - mean) / std`` with the training rows' statistics.
        :param return_series: add each window's series id to ``x``.
        :param memory_budget: as for :meth:`tf_dataset` (per process: Grain's
            worker processes each hold their own rows).
        :param num_shards: as for :meth:`tf_dataset`; give the Grain sampler
            ``grain.sharding.NoSharding()`` then (the source is the shard).
        :param shard_index: as for :meth:`tf_dataset`.
        :param spill_dir: as for :meth:`tf_dataset`.
        """
        from windowkit.readers.grain import batch_source

        return batch_source(self.read_plan(split), batch_size, shuffle=shuffle, seed=seed,
            epoch=epoch, epochs=epochs, drop_remainder=drop_remainder, normalize=normalize,
            return_series=return_series, num_shards=num_shards, shard_index=shard_index,
            memory_budget=memory_budget, spill_dir=spill_dir)


def _as_dict(stats: Statistics | None) -> dict[str, Any] | None:
    return None if stats is None else stats.model_dump()
