"""Real public data that nobody here wrote (``fixtures/real``, see its SOURCES.md),
converted through the CLI in every format: the expected window counts, windows
equal to the file's rows, no leakage between splits, and missing values refused
unless ``--nan skip``.

Each oracle is built independently with pandas from the same file.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

import windowkit as wk
from tests.conftest import assert_windows_equal, oracle_windows, oracle_windows_within
from windowkit.cli import main

REAL = Path(__file__).resolve().parents[2] / "fixtures" / "real"


def _convert(tmp_path: Path, fmt: str, source: str, *options: str) -> wk.Store:
    out = tmp_path / "store"
    tmp_path.mkdir(parents=True, exist_ok=True)
    result = CliRunner().invoke(main, ["convert", str(REAL / source), "--format", fmt,
                                       "--out", str(out), "-q", *options])
    assert result.exit_code == 0, result.output
    return wk.open_store(out)


def _windows(store: wk.Store, split: str = "train") -> tuple[np.ndarray, np.ndarray | None]:
    got = store.windows(split, np.arange(store.num_windows(split)))
    return got if isinstance(got, tuple) else (got, None)


def _runs(ok: np.ndarray) -> list[tuple[int, int]]:
    """Maximal runs of True in ``ok`` as (start, stop)."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], ok.astype(np.int8), [0]])))
    return [(int(a), int(b)) for a, b in edges.reshape(-1, 2)]


def test_grunfeld_investment_panel(tmp_path: Path, concept_format: str) -> None:
    """11 firms x 20 years, long form, integer years."""
    frame = pd.read_csv(REAL / "grunfeld.csv")
    features = ["invest", "value", "capital"]
    store = _convert(tmp_path, concept_format, "grunfeld.csv", "--series-col", "firm", "--time-col",
                     "year", "--columns", ",".join(features), "--window", "5", "--horizon", "1")
    assert store.manifest.series.count == 11
    assert store.num_windows("train") == 11 * (20 - 6 + 1)
    series = [g[features].to_numpy() for _, g in frame.groupby("firm", sort=False)]
    x, y = _windows(store)
    want_x, want_y = oracle_windows(series, wk.WindowSpec(5, horizon=1))
    assert_windows_equal(x, y, want_x, want_y, in_order=True)


def test_grunfeld_chronological_splits_do_not_leak(tmp_path: Path, concept_format: str) -> None:
    store = _convert(tmp_path, concept_format, "grunfeld.csv", "--series-col", "firm", "--time-col",
                     "year", "--columns", "invest,value,capital", "--window", "4",
                     "--split", "train=0.6,val=0.2,test=0.2")
    index = {s: store.index(s) for s in store.splits}
    for firm in range(11):
        rows = {s: {int(r) for _, start, length in idx[idx[:, 0] == firm]
                    for r in range(start, start + length)} for s, idx in index.items()}
        assert not rows["train"] & rows["val"] and not rows["val"] & rows["test"]
        assert not rows["train"] & rows["test"]
        assert max(rows["train"]) < min(rows["val"]) <= max(rows["val"]) < min(rows["test"])
    assert all(store.num_windows(s) > 0 for s in store.splits)


def test_grunfeld_history_context_validates_on_the_last_years(tmp_path: Path,
                                                              concept_format: str) -> None:
    """Window 5, horizon 1, 80/20: with ``none`` no validation window fits in 4
    years; with ``history`` each firm has 4, whose targets are exactly its last
    4 years (the last 20%), and no training window holds one of them."""
    args = ["--series-col", "firm", "--time-col", "year", "--columns",
            "invest,value,capital", "--window", "5", "--horizon", "1",
            "--split", "train=0.8,val=0.2"]
    assert _convert(tmp_path / "none", concept_format, "grunfeld.csv",
                    *args).num_windows("val") == 0
    store = _convert(tmp_path / "history", concept_format, "grunfeld.csv", *args,
                     "--split-context", "history")
    frame = pd.read_csv(REAL / "grunfeld.csv")
    firms = [g.sort_values("year") for _, g in frame.groupby("firm", sort=False)]
    x, y = _windows(store, "val")
    assert y is not None and len(y) == 11 * 4
    want_y = np.concatenate([g[["invest", "value", "capital"]].to_numpy()[16:] for g in firms])
    np.testing.assert_allclose(y[:, 0, :], want_y, rtol=1e-6)
    want_x = np.stack([g[["invest", "value", "capital"]].to_numpy()[s:s + 5]
                       for g in firms for s in range(11, 15)])
    np.testing.assert_allclose(x, want_x, rtol=1e-6)
    index = store.index("train")
    train_rows = {(int(f), r) for f, start, length in index.tolist()
                  for r in range(start, start + length)}
    val_targets = {(int(f), start + 5) for f, start, _ in store.index("val").tolist()}
    assert not train_rows & val_targets and store.num_windows("train") == 11 * 11
    png = tmp_path / "store.png"
    shown = CliRunner().invoke(main, ["inspect", str(store.path), "--plot", str(png)]).output
    assert "split context" in shown and "history" in shown
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert re.search(r"windows \[val\]\s+44\s+\(target times 1951\.\.1954\)", shown), shown


def test_mauna_loa_co2_with_missing_weeks(tmp_path: Path, concept_format: str) -> None:
    """Weekly CO2, 1958-2001, integer dates (19580329), 59 empty weeks."""
    frame = pd.read_csv(REAL / "co2.csv")
    args = ["--time-col", "date", "--time-format", "%Y%m%d", "--columns", "co2",
            "--window", "52", "--horizon", "4"]
    refused = CliRunner().invoke(main, ["convert", str(REAL / "co2.csv"), "--format",
                                        concept_format,
                                        "--out", str(tmp_path / "no"), *args])
    first_missing = int(np.flatnonzero(frame["co2"].isna())[0])
    assert refused.exit_code == 2 and refused.output.count("\n") == 1
    assert f"row {first_missing}, column 'co2' is missing (empty or NaN)" in refused.output
    assert "--nan skip" in refused.output and not (tmp_path / "no").exists()

    store = _convert(tmp_path, concept_format, "co2.csv", *args, "--nan", "skip")
    values = frame[["co2"]].to_numpy()
    pieces = [values[a:b] for a, b in _runs(frame["co2"].notna().to_numpy())]
    want_x, want_y = oracle_windows(pieces, wk.WindowSpec(52, horizon=4))
    assert store.num_windows("train") == len(want_x) > 0
    x, y = _windows(store)
    assert_windows_equal(x, y, want_x, want_y, in_order=True)
    assert store.manifest.series.missing_rows == 59
    assert store.manifest.series.gap_skipped_windows == 0  # every week is there
    stats = store.manifest.normalization
    assert stats is not None
    np.testing.assert_allclose(stats.mean, [np.nanmean(values)], rtol=1e-12)


def test_stock_prices_of_different_lengths(tmp_path: Path, concept_format: str) -> None:
    """Five monthly series (GOOG is shorter), text dates such as 'Jan 1 2000'."""
    frame = pd.read_csv(REAL / "stocks.csv")
    store = _convert(tmp_path, concept_format, "stocks.csv", "--series-col", "symbol", "--time-col",
                     "date", "--time-format", "%b %d %Y", "--window", "12", "--horizon", "3")
    sizes = frame.groupby("symbol", sort=False).size()
    assert store.num_windows("train") == sum(n - 15 + 1 for n in sizes) == 4 * 109 + 54
    assert store.manifest.series.gap_skipped_windows == 0  # months of 28-31 days
    series = [g[["price"]].to_numpy() for _, g in frame.groupby("symbol", sort=False)]
    x, y = _windows(store)
    want_x, want_y = oracle_windows(series, wk.WindowSpec(12, horizon=3))
    assert_windows_equal(x, y, want_x, want_y, in_order=True)
    shown = CliRunner().invoke(main, ["inspect", str(store.path)])
    assert "(times 2000-01-01..2010-03-01)" in shown.output


def test_seattle_weather_forecasting_one_column(tmp_path: Path, concept_format: str) -> None:
    """Daily weather with a text column; forecast tomorrow's maximum temperature."""
    frame = pd.read_csv(REAL / "seattle-weather.csv")
    refused = CliRunner().invoke(main, [
        "convert", str(REAL / "seattle-weather.csv"), "--format", concept_format, "--out",
        str(tmp_path / "no"), "--time-col", "date", "--time-format", "%Y/%m/%d",
        "--window", "7", "--horizon", "1"])
    assert refused.exit_code == 2 and "column 'weather' is not numeric" in refused.output
    features = ["precipitation", "temp_max", "temp_min", "wind"]
    store = _convert(tmp_path, concept_format, "seattle-weather.csv", "--time-col", "date",
                     "--time-format", "%Y/%m/%d", "--columns", ",".join(features),
                     "--window", "7", "--horizon", "1", "--target-columns", "temp_max")
    assert store.num_windows("train") == len(frame) - 8 + 1
    x, y = _windows(store)
    want_x, want_y = oracle_windows([frame[features].to_numpy()], wk.WindowSpec(7, horizon=1))
    assert want_y is not None and y is not None and y.shape[1:] == (1, 1)
    assert_windows_equal(x, y, want_x, want_y[:, :, [1]], in_order=True)
    assert store.manifest.series.time_unit == "days"


def test_san_francisco_hourly_temperatures_with_a_missing_hour(tmp_path: Path, concept_format: str
                                                                ) -> None:
    frame = pd.read_csv(REAL / "sf-temps.csv")
    hours = pd.to_datetime(frame["date"], format="%Y/%m/%d %H:%M:%S")
    cut = int(np.flatnonzero(hours.diff() > pd.Timedelta(hours=1))[0])
    store = _convert(tmp_path, concept_format, "sf-temps.csv", "--time-col", "date",
                     "--time-format",
                     "%Y/%m/%d %H:%M:%S", "--window", "24", "--stride", "2")
    values = frame[["temp"]].to_numpy()
    want_x = oracle_windows_within(values, wk.WindowSpec(24, stride=2),
                                   [(0, cut), (cut, len(values))])  # the gap removes windows
    assert store.num_windows("train") == len(want_x)
    x, _ = _windows(store)
    np.testing.assert_array_equal(x, want_x)
    assert store.manifest.series.gap_skipped_windows > 0
    # with --max-gap 2h the missing hour is no gap
    spanning = _convert(tmp_path / "again", concept_format, "sf-temps.csv", "--time-col", "date",
                        "--time-format", "%Y/%m/%d %H:%M:%S", "--window", "24",
                        "--stride", "2", "--max-gap", "2h")
    assert spanning.num_windows("train") == len(oracle_windows([values],
                                                               wk.WindowSpec(24, stride=2))[0])


def test_iowa_electricity_yearly_with_leap_years(tmp_path: Path, concept_format: str) -> None:
    """Three sources x 17 years, ISO dates: years of 365 and 366 days are no gap."""
    frame = pd.read_csv(REAL / "iowa-electricity.csv")
    store = _convert(tmp_path, concept_format, "iowa-electricity.csv", "--series-col", "source",
                     "--time-col", "year", "--window", "5")
    assert store.num_windows("train") == 3 * (17 - 5 + 1)
    series = [g[["net_generation"]].to_numpy() for _, g in frame.groupby("source", sort=False)]
    x, _ = _windows(store)
    np.testing.assert_array_equal(x, oracle_windows(series, wk.WindowSpec(5))[0])


def _epoch(batches: object) -> tuple[np.ndarray, np.ndarray]:
    """One pass of a reader's (x, y) batches (tensors or NumPy; x a dict's inputs), joined."""
    xs, ys = [], []
    for x, y in batches:  # type: ignore[attr-defined]
        x = x["inputs"] if isinstance(x, dict) else x
        xs.append(np.asarray(x))
        ys.append(np.asarray(y))
    return np.concatenate(xs), np.concatenate(ys)


def test_gapminder_panel_as_shipped_gzip_compressed(tmp_path: Path, concept_format: str) -> None:
    """142 countries x 12 observations five years apart (1952-2007), a ``.csv.gz``
    with text columns: forecast life expectancy one step ahead, static
    centroids, validation with history on each country's last three steps."""
    frame = pd.read_csv(REAL / "gapminder.csv.gz")
    refused = CliRunner().invoke(main, ["convert", str(REAL / "gapminder.csv.gz"), "--format",
                                        concept_format, "--out", str(tmp_path / "no"), "--window",
                                        "4", "--series-col", "country", "--time-col", "year"])
    assert refused.exit_code == 2 and refused.output.count("\n") == 1
    assert "gapminder.csv.gz: column 'continent' is not numeric" in refused.output
    features = ["lifeExp", "pop", "gdpPercap"]
    store = _convert(tmp_path, concept_format, "gapminder.csv.gz", "--series-col", "country",
                     "--time-col", "year", "--columns", ",".join(features), "--target-columns",
                     "lifeExp", "--static-columns", "centroid_lat,centroid_lon", "--window", "4",
                     "--horizon", "1", "--split", "train=0.75,val=0.25", "--split-context",
                     "history")
    countries = [g for _, g in frame.groupby("country", sort=False)]
    assert store.manifest.series.count == 142 and store.manifest.series.gap_skipped_windows == 0
    spec = wk.WindowSpec(4, horizon=1)
    per_country = [oracle_windows([g[features].to_numpy()], spec) for g in countries]
    for split, starts in (("train", slice(0, 5)), ("val", slice(5, 8))):  # 9 years train
        want_x = np.concatenate([x[starts] for x, _ in per_country])
        want_y = np.concatenate([y[starts][:, :, [0]] for _, y in per_country if y is not None])
        x, y = store.windows(split, np.arange(store.num_windows(split)))
        assert_windows_equal(x["inputs"], y, want_x, want_y, in_order=True)
        static = np.repeat([g[["centroid_lat", "centroid_lon"]].to_numpy()[0]
                            for g in countries], starts.stop - starts.start, axis=0)
        np.testing.assert_array_equal(x["static"], static)
        read = _epoch(store.tf_dataset(split, 64, shuffle=False))
        assert_windows_equal(*read, want_x, want_y, in_order=True)
    shown = CliRunner().invoke(main, ["inspect", str(store.path)]).output
    assert re.search(r"windows \[val\]\s+426\s+\(target times 1997\.\.2007\)", shown), shown


def test_microsoft_trading_days_across_weekends_and_closures(tmp_path: Path,
                                                           concept_format: str) -> None:
    """Daily MSFT prices and volumes on trading days, 1986-2017: weekends and
    holidays (2-4 days) are no gap with ``--max-gap 4D``; the closures after
    9/11, for President Ford and for hurricane Sandy are; splits at 2010 and 2014."""
    frame = pd.read_csv(REAL / "msft.csv")
    args = ["--time-col", "Date", "--columns", "Open,High,Low,Close,Volume", "--target-columns",
            "Close", "--window", "20", "--horizon", "5", "--split-at", "2010,2014", "--split",
            "fit,check,hold"]
    refused = CliRunner().invoke(main, ["convert", str(REAL / "msft.csv"), "--format",
                                        concept_format, "--out", str(tmp_path / "no"), *args])
    assert refused.exit_code == 2 and refused.output.count("\n") == 1
    assert "would span a time gap" in refused.output and not (tmp_path / "no").exists()
    store = _convert(tmp_path, concept_format, "msft.csv", *args, "--max-gap", "4D")
    days = pd.to_datetime(frame["Date"])
    closures = np.flatnonzero(days.diff() > pd.Timedelta(days=4)).tolist()
    cuts = np.searchsorted(days, pd.to_datetime(["2010-01-01", "2014-01-01"])).tolist()
    bounds = [0, *cuts, len(frame)]
    values = frame[["Open", "High", "Low", "Close", "Volume"]].to_numpy(dtype=np.float64)
    spec = wk.WindowSpec(20, horizon=5)
    all_x, all_y = oracle_windows([values], spec)
    assert all_y is not None and len(closures) == 3
    for k, split in enumerate(("fit", "check", "hold")):
        edges = sorted({bounds[k], bounds[k + 1], *(c for c in closures
                                                      if bounds[k] < c < bounds[k + 1])})
        keep = np.zeros(len(all_x), dtype=bool)
        for a, b in itertools.pairwise(edges):
            keep |= (np.arange(len(all_x)) >= a) & (np.arange(len(all_x)) + spec.span <= b)
        want_x, want_y = all_x[keep], all_y[keep][:, :, [3]]
        x, y = _windows(store, split)
        assert_windows_equal(x, y, want_x, want_y, in_order=True)
        for reader in (store.keras_dataset(split, 256, seed=k),
                       store.torch_dataset(split, 256, seed=k)):
            assert_windows_equal(*_epoch(reader), want_x, want_y, in_order=False)
    assert store.manifest.series.gap_skipped_windows == 3 * (spec.span - 1)
    shown = CliRunner().invoke(main, ["inspect", str(store.path)]).output
    assert re.search(r"windows \[check\]\s+958\s+\(times 2010-01-04\.\.2013-12-31\)", shown)


@pytest.mark.parametrize(("value", "message"), [
    ("%Y-%m-%d", "row 0, time 'Jan 1 2000' does not match --time-format '%Y-%m-%d'"),
    (None, "time column 'date' holds text ('Jan 1 2000' first), not times; pass its format "
           "with --time-format"),
])
def test_text_times_need_their_format(tmp_path: Path, value: str | None, message: str) -> None:
    args = ["convert", str(REAL / "stocks.csv"), "--format", "zarr", "--out",
            str(tmp_path / "s"), "--series-col", "symbol", "--time-col", "date", "--window", "4"]
    result = CliRunner().invoke(main, args + (["--time-format", value] if value else []))
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert message in result.output
    assert not (tmp_path / "s").exists()


def test_the_readme_forecasting_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                             ) -> None:
    """The README's DeepAR-style example, as written there: static and
    known-future inputs, a series embedding, validation with history."""
    import keras

    readme = (REAL.parent.parent / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    code = next(b for b in blocks if 'frame = pd.read_csv("fixtures/real/grunfeld.csv")' in b)
    monkeypatch.chdir(tmp_path)
    # 3 of the README's 30 epochs: each is one more pass of the same pipelines, and
    # the loss falls from the first epoch on (the model learns)
    assert "epochs=30" in code
    code = code.replace("fixtures/real/", f"{REAL}/").replace("epochs=30", "epochs=3, verbose=0")
    scope: dict[str, object] = {"pd": pd, "wk": wk, "keras": keras, "np": np}
    exec(compile(code, "README.md", "exec"), scope)
    store, model = scope["store"], scope["model"]
    assert isinstance(store, wk.Store) and store.num_windows("val") == 44
    losses = model.history.history  # type: ignore[attr-defined]
    assert losses["loss"][-1] < losses["loss"][0] and np.isfinite(losses["val_loss"]).all()
    x, _y = store.windows("val", [0])
    assert x["static"][0, 0] == pd.read_csv(REAL / "grunfeld.csv").groupby(
        "firm", sort=False)["capital"].first().iloc[0]
