"""The report's decision section: the faster and the cheaper device named only when the
repeats show it, prices with their sources, devices charged, oversubscribed runs marked and left
out of fits, the fitted scaling and the 20-tokens-per-parameter budget.

The result sets are built from a real CPU result (tests/data/report/source-tiny-cpu.json, a
`hwbench run --model tiny` on this project's CPU machine) with the device fields, throughput and
the issue-16 environment fields (devices_used, oversubscribed) set by hand: a pair of device
models needs two machines this project does not have. Every expected figure is computed by hand
below."""

from __future__ import annotations

import copy
import io
import json
import math
import re
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from hwbench.cli import run_command
from hwbench.errors import UsageError
from hwbench.report.cells import fmt

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "tests" / "data" / "report" / "source-tiny-cpu.json"
PUBLISHED = REPO / "results" / "published"
TINY_PARAMETERS = 6_852_096  # the source result's workload.parameters
H100 = {"backend": "cuda", "device_model": "NVIDIA H100 80GB HBM3", "catalog_entry": "h100-sxm",
        "price_usd_per_hour": None}
A100 = {"backend": "cuda", "device_model": "NVIDIA A100-SXM4-40GB", "catalog_entry": "a100-sxm",
        "price_usd_per_hour": None}


def report(*argv: str) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        assert run_command("report", list(argv)) == 0
    return out.getvalue()


def result(run_id: str, device: dict, world: int, tokens_per_s: float, seed: int, **environment) -> dict:
    data = json.loads(SOURCE.read_text())
    data = copy.deepcopy(data)
    data["run_id"] = run_id
    data["device"].update(device, simulated=False, device_count=world)
    data["spec"]["seed"] = seed
    data["spec"]["parallel"] = {"tp": 1, "pp": 1, "dp": world, "source": "user"}
    data["spec"]["launch"]["nproc_per_node"] = world
    data["environment"].update(backend=device["backend"], device_models=[device["device_model"]], **environment)
    seq = data["spec"]["seq_length"]
    data["metrics"].update(world_size=world, tokens_per_s=tokens_per_s, tokens_per_s_per_device=tokens_per_s / world,
                           samples_per_s=tokens_per_s / seq)
    return data


def write(folder: Path, *results: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for data in results:
        (folder / f"{data['run_id']}.json").write_text(json.dumps(data))
    return folder


@pytest.fixture
def pair(tmp_path) -> Path:
    """H100: 3 runs on 1 device (1000, 1010, 990 tokens/s) and 3 on 2 (1900, 1920, 1880), plus an
    oversubscribed 4-device run (10 tokens/s) that must not enter the fit; A100: 3 runs on 1 device
    (500, 505, 495)."""
    runs = [result(f"2026112{i}T000000Z-tiny-cuda-h1{i}", H100, 1, t, i, devices_used=1)
            for i, t in enumerate((1000, 1010, 990))]
    runs += [result(f"2026112{i}T010000Z-tiny-cuda-h2{i}", H100, 2, t, i, devices_used=2)
             for i, t in enumerate((1900, 1920, 1880))]
    runs.append(result("20261124T020000Z-tiny-cuda-h4x", H100, 4, 10, 0, devices_used=4, oversubscribed=True,
                       oversubscribed_reason="devices shared with another job"))
    runs += [result(f"2026112{i}T030000Z-tiny-cuda-a1{i}", A100, 1, t, i, devices_used=1)
             for i, t in enumerate((500, 505, 495))]
    return write(tmp_path / "pair", *runs)


def test_faster_and_cheaper_named_with_the_repeats(pair):
    text = report(str(pair), "--against", str(PUBLISHED))
    decision = text.split("## Decision")[1].split("## Runs")[0]
    # tokens/s per device: H100 median 1000 (its 1-device point beats 950 on 2), A100 500: 2.00x, 3 vs 3 separated
    assert ("Faster: NVIDIA H100 80GB HBM3, 2.00x the tokens/s per device of NVIDIA A100-SXM4-40GB; shown by the "
            "repeats (3 and 3 runs; p=0.1 (exact U=0), separated).") in decision
    # $ per million tokens with the catalog's prices: 6.88/3600/1000e-6 = 1.911 against 2.7447/3600/500e-6 = 1.525
    h100, a100 = 6.88 / 3600 / 1000 * 1e6, 2.7447 / 3600 / 500 * 1e6
    assert f"Cheaper: NVIDIA A100-SXM4-40GB, ${a100:,.4g} per million tokens against ${h100:,.4g}" in decision
    assert f"({a100 / h100:.2f}x); shown by the repeats" in decision
    # every price used, with its source and date
    assert "p5.48xlarge (8x H100 SXM 80GB), us-east-1: $55.04/h / 8 GPUs" in decision and "2026-08-26" in decision
    assert "p4d.24xlarge (8x A100 SXM4 40GB)" in decision


def test_projection_uses_the_fitted_scaling_and_the_budget(pair):
    text = report(str(pair), "--against", str(PUBLISHED))
    decision = text.split("## Decision")[1].split("## Runs")[0]
    budget = 20 * TINY_PARAMETERS
    assert "Token budget: 137.042e6 tokens (20 tokens per parameter x 6.85M parameters" in decision
    # fit over (1, 1000) and (2, 1900): slope log2(1.9), 95% per doubling; 8 devices from the 1-device point:
    # 1000 x 8^log2(1.9) = 1000 x 1.9^3 = 6859 tokens/s; the oversubscribed 4-device run is not a point
    days = budget / (1000 * 1.9 ** 3) / 86400
    cost = 6.88 * 8 * days * 24
    assert (f"Time to train on 8 x NVIDIA H100 80GB HBM3: 137.042e6 tokens take {fmt(days, 2)} days and costs "
            f"${cost:,.0f}, projected to 8 devices with the scaling fitted to 1, 2 devices (95% efficiency per "
            "doubling).") in decision
    # the A100, one device count: linear, said in the same sentence
    days_a100 = budget / (500 * 8) / 86400
    assert (f"Time to train on 8 x NVIDIA A100-SXM4-40GB: 137.042e6 tokens take {fmt(days_a100, 2)} days and costs "
            f"${2.7447 * 8 * days_a100 * 24:,.0f}, projected linearly from 1 device(s): measured at one device "
            "count only") in decision
    # the fitted points are shown: 1 and 2 devices, fitted exactly by a line through two points
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in decision.splitlines()
            if line.startswith("| 2 ")]
    assert rows == [["2", "TP1 PP1 DP2", "3", "1,900.0", "1,900.0", "2,000.0", "95%"]]


def test_oversubscribed_run_is_marked_everywhere_and_left_out(pair):
    data = json.loads(report(str(pair), "--format", "json"))
    marked = next(r for r in data["runs"] if r["run_id"].endswith("h4x"))
    assert marked["oversubscribed"] is True and marked["devices_charged"] == 4
    text = report(str(pair))
    runs_table = text.split("## Runs")[1].split("## Against")[0]
    assert "oversubscribed (devices shared with another job): left out of decisions and scaling fits" in runs_table
    assert text.split("## Procurement")[1].count("[oversubscribed]") == 1
    assert text.split("## Per model")[1].split("## Procurement")[0].count("[oversubscribed]") == 1
    from hwbench.report.plots import throughput

    rows = [r for r in data["runs"] if r["model"] == "tiny"]
    chart = throughput("tiny", rows)
    assert "tiny: throughput per device charged (1 oversubscribed run(s) left out)" in chart
    assert "oversubscribed" not in chart.replace("oversubscribed run(s) left out", "")


def test_throughput_bars_carry_the_range_of_their_repeats(pair):
    """Each bar is the median of its point's 3 repeats and its whisker spans the slowest to the
    fastest: H100 1 device 990-1010 around 1000, 2 devices 940-960 per device around 950, A100
    495-505 around 500 tokens/s per device."""
    import re

    from hwbench.report.plots import throughput

    data = json.loads(report(str(pair), "--format", "json"))
    chart = throughput("tiny", [r for r in data["runs"] if r["model"] == "tiny"])
    bars = {title: (float(x) + float(width) / 2, float(y)) for x, y, width, title in
            re.findall(r'<rect x="([\d.]+)" y="([\d.]+)" width="([\d.]+)"[^>]*><title>([^<]*)</title>', chart)}
    whiskers = re.findall(r'<path class="whisker" d="M([\d.]+),([\d.]+)V([\d.]+)[^"]*"[^>]*><title>([^<]*)</title>',
                          chart)
    assert len(bars) == len(whiskers) == 3
    spans = {}
    for x, top, bottom, title in whiskers:
        centre, bar_top = bars[title]
        assert float(x) == pytest.approx(centre, abs=0.1)  # on its own bar
        assert float(top) < bar_top < float(bottom)  # fastest above the median, slowest below (y grows down)
        spans[title.split(":")[0]] = (float(bottom) - float(top)) / (float(bottom) - bar_top)  # range / (median - min)
    # symmetric ranges: each whisker reaches as far above its bar as below
    assert all(ratio == pytest.approx(2, abs=0.05) for ratio in spans.values()), spans
    assert "median 1,000.0 tokens/s per device over 3 run(s): 1,000.0, 1,010.0, 990.0" in chart


def noisy(tmp_path) -> Path:
    """Three repeats a side, the H100's ranging 186-651 tokens/s (CV 55.5%), the A100's 200-260."""
    return write(tmp_path / "noisy", *[result(f"2026112{i}T000000Z-tiny-cuda-h1{i}", H100, 1, t, i, devices_used=1)
                                       for i, t in enumerate((186, 420, 651))],
                 *[result(f"2026112{i}T030000Z-tiny-cuda-a1{i}", A100, 1, t, i, devices_used=1)
                   for i, t in enumerate((200, 230, 260))])


def test_a_noisy_lead_is_inconclusive_and_its_spread_is_in_the_verdict(tmp_path):
    """A 1.83x lead from repeats that spread 186-651 is not a winner: the verdict says inconclusive,
    and the spread and the noisy flag of both sides stand in the sentence that names the leader."""
    import statistics

    decision = report(str(noisy(tmp_path))).split("## Decision")[1].split("## Runs")[0]
    h100_cv = statistics.stdev([186, 420, 651]) / statistics.fmean([186, 420, 651])
    a100_cv = statistics.stdev([200, 230, 260]) / statistics.fmean([200, 230, 260])
    faster = next(line for line in decision.splitlines() if line.startswith("Faster:"))
    assert faster.startswith("Faster: inconclusive: not significant with 3 and 3 runs (NVIDIA H100 80GB HBM3 leads: "
                             "1.83x the tokens/s per device of NVIDIA A100-SXM4-40GB; p=0.7 (exact U=3)).")
    assert (f"Spread of the repeats (tokens/s per device): NVIDIA H100 80GB HBM3 186.0-651.0, CV {h100_cv:.1%}, noisy "
            f"(CV above 5%); NVIDIA A100-SXM4-40GB 200.0-260.0, CV {a100_cv:.1%}, noisy (CV above 5%).") in faster
    assert "within noise" not in decision
    row = next(line for line in decision.splitlines() if line.startswith("| NVIDIA H100"))
    assert f"| {h100_cv:.1%} noisy " in row and "420.0 (186.0-651.0)" in row


def test_a_long_reason_is_a_footnote_not_a_cell(pair):
    """J/token without energy: a short cell and its reason once under the table, in both tables."""
    text = report(str(pair))
    for section in (text.split("## Decision")[1].split("## Runs")[0], text.split("## Procurement")[1]):
        rows = [line for line in section.splitlines() if line.startswith("| 2026") or line.startswith("| NVIDIA")]
        assert rows and all("no power or thermal sensors" not in line for line in rows)
        marker = re.search(r"\| not measured \[(\d+)\] +\|", rows[0]).group(1)
        assert f"[{marker}] energy not measured: no power or thermal sensors are read on the CPU backend." in section


def test_the_cpu_prediction_says_what_it_does_not_model(tmp_path):
    cpu = {"backend": "cpu", "device_model": "AMD EPYC", "catalog_entry": None, "price_usd_per_hour": None}
    folder = write(tmp_path / "cpu", result("20261121T000000Z-tiny-cpu-one", cpu, 1, 900, 1, devices_used=1))
    per_model = report(str(folder)).split("## Per model")[1].split("## Procurement")[0]
    row = next(line for line in per_model.splitlines() if line.startswith("| 2026"))
    marker = re.search(r"GiB \[(\d+)\] +\| [\d.,]+ GiB +\|$", row).group(1)
    assert (f"[{marker}] on the CPU the measured peak is the process's peak resident set (VmHWM): besides the tensors "
            "the planner predicts") in per_model


def test_one_run_a_side_is_not_distinguishable(tmp_path):
    folder = write(tmp_path / "single", result("20261121T000000Z-tiny-cuda-h1", H100, 1, 1000, 1),
                   result("20261121T000000Z-tiny-cuda-a1", A100, 1, 500, 1))
    decision = report(str(folder), "--tokens", "1e9").split("## Decision")[1].split("## Runs")[0]
    assert ("Faster: not distinguishable with 1 and 1 runs (NVIDIA H100 80GB HBM3 leads: 2.00x the tokens/s per "
            "device of NVIDIA A100-SXM4-40GB; fewer than 2 runs a side).") in decision
    assert "Token budget: 1e9 tokens (--tokens)" in decision


def test_cpu_ranks_on_one_socket_are_one_device_and_oversubscription_is_judged(tmp_path):
    """Older CPU results record neither devices_used nor oversubscribed: one socket per node is
    charged, and ranks x threads per rank above the usable cores is oversubscribed."""
    cpu = {"backend": "cpu", "device_model": "AMD EPYC", "catalog_entry": None, "price_usd_per_hour": None}
    fits = result("20261121T000000Z-tiny-cpu-fits", cpu, 2, 900, 1)
    fits["environment"]["tuning"]["intra_op_threads"] = 1  # 2 ranks x 1 thread on 2 cores
    over = result("20261121T000000Z-tiny-cpu-over", cpu, 2, 400, 2)
    over["environment"]["tuning"]["intra_op_threads"] = 2  # 2 ranks x 2 threads on 2 cores
    for data in (fits, over):
        data["device"]["tuning"] = data["environment"]["tuning"]
    folder = write(tmp_path / "cpu", fits, over)
    data = json.loads(report(str(folder), "--format", "json", "--price", "AMD EPYC=0.5"))
    rows = {r["run_id"][-4:]: r for r in data["runs"]}
    assert rows["fits"]["devices_charged"] == 1 and "one CPU socket per node" in rows["fits"]["devices_charged_basis"]
    assert rows["fits"]["cost_per_million_tokens_usd"] == pytest.approx(0.5 / 3600 * 1 / 900 * 1e6)
    assert rows["fits"]["oversubscribed"] is False
    assert rows["over"]["oversubscribed"] is True
    assert rows["over"]["oversubscribed_reason"] == "2 ranks x 2 threads per rank on 2 usable cores"
    text = report(str(folder), "--price", "AMD EPYC=0.5")
    assert "AMD EPYC x1 (2 ranks) [CPU]" in text


def test_prices_file_and_its_errors(tmp_path, pair):
    prices = tmp_path / "prices.yaml"
    prices.write_text("h100-sxm: {usd_per_hour: 2.0, source: our contract, date: 2026-11-01}\n"
                      "NVIDIA A100-SXM4-40GB: 1.5\n")
    data = json.loads(report(str(pair), "--format", "json", "--prices", str(prices)))
    h100 = next(r for r in data["runs"] if r["run_id"].endswith("h10"))
    a100 = next(r for r in data["runs"] if r["run_id"].endswith("a10"))
    assert (h100["price_usd_per_hour"], h100["price_source"], h100["price_date"]) == (2.0, "our contract", "2026-11-01")
    assert (a100["price_usd_per_hour"], a100["price_source"]) == (1.5, f"--prices {prices}")
    # --price wins over the file
    data = json.loads(report(str(pair), "--format", "json", "--prices", str(prices), "--price", "h100-sxm=3"))
    assert next(r for r in data["runs"] if r["run_id"].endswith("h10"))["price_usd_per_hour"] == 3.0
    for text, pattern in (("h100-sxm: lots\n", "entry 'h100-sxm' is 'lots'; accepted: a number >= 0"),
                          ("h100-sxm: {usd: 2}\n", "entry 'h100-sxm' has unknown key 'usd'"),
                          ("- 1\n", "must be a mapping"), ("a: [\n", "not a YAML file"),
                          ('h100-sxm: "1.5"\n', "entry 'h100-sxm' is '1.5'"),
                          ("h100-sxm: 1\nH100-SXM: 2\n", "'H100-SXM' is named twice"),
                          ("h100-sxm: 1\nh100-sxm: 2\n", "line 1: 'h100-sxm' is named twice"),
                          ("h100-sxm: {usd_per_hour: 1, date: soon}\n", "has date 'soon'"),
                          ("h100-sxm: {usd_per_hour: 1, date: 2026-13-01}\n", "cannot read \\(month must be in"),
                          ("h100-sxm: {usd_per_hour: 1, source: [1, 2]}\n", "has source \\[1, 2\\]"),
                          # an alias bomb: nine lines that expand to 10^9 strings
                          ("a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
                              f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n"
                              for i in range(8)), "line 2: aliases \\(\\*name\\) are not accepted")):
        prices.write_text(text)
        with pytest.raises(UsageError, match=pattern) as error:
            run_command("report", [str(pair), "--prices", str(prices)])
        assert "\n" not in str(error.value)
    with pytest.raises(UsageError, match="/dev/zero: larger than 1 MiB"):  # read up to a limit, not forever
        run_command("report", [str(pair), "--prices", "/dev/zero"])


@pytest.mark.parametrize("tokens", ["1e30", "5e-324", "1.5", "0", "nan"])
def test_a_token_budget_out_of_range_is_refused(tokens, pair):
    with pytest.raises(UsageError, match=f"--tokens '{tokens}' is not accepted; give a whole number of tokens "
                                         "from 1 to 1e18"):
        run_command("report", [str(pair), "--tokens", tokens])


def test_published_tables_alone(tmp_path):
    text = report("--against", str(PUBLISHED))
    decision = text.split("## Decision")[1]
    # 345m: 8p-NPU 59.7 samples/s x 1024 / 8 devices = 7641.6 tokens/s per device; 8p-GPU(V) 37.8 -> 4838.4
    assert f"has {59.7 / 37.8:.2f}x the tokens/s per device of published 8p-GPU(V)" in decision
    assert "one figure each, no repeats: no confidence can be stated" in decision
    # the V100-class row is priced as the catalog's v100-sxm2 ($3.06, AWS p3.16xlarge); no Ascend 910 price
    assert "priced as catalog v100-sxm2" in decision and "$3.06" in decision
    assert "no public on-demand list price of an Ascend 910 instance found" in decision
    # 345m's budget: 20 x 354,871,296 parameters
    assert f"Token budget: {20 * 354_871_296 / 1e9:g}e9 tokens (20 tokens per parameter" in decision
    days = 20 * 354_871_296 / (37.8 * 1024) / 86400  # 8 devices, the published count: no scaling needed
    assert f"| {fmt(days, 2)} " in decision
    assert math.isfinite(days)


def test_html_renders_offline_in_chromium_and_a_legend_click_hides_its_series(pair, tmp_path):
    """The page is opened in headless Chromium (a few seconds): no script error, the charts are
    in the DOM, and a click on a legend entry hides that series (the click is sent by a script
    appended to the page for the test)."""
    import re
    import shutil
    import subprocess

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed: the HTML report is not rendered")
    page = tmp_path / "report.html"
    assert run_command("report", [str(pair), "--format", "html", "--out", str(page)]) == 0
    click = ('<script>document.querySelector("svg.chart g.legend").dispatchEvent(new MouseEvent("click"));'
             "</script></body>")
    page.write_text(page.read_text().replace("</body>", click))
    done = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                           "--v=0", "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Uncaught" not in done.stderr
    dom = done.stdout
    assert len(re.findall(r'<svg class="chart"', dom)) == 5  # tiny: decision, throughput, scaling, memory, loss
    decision = dom.split('<section id="decision">')[1].split("</section>")[0]
    assert len(re.findall(r'<path class="whisker"', decision)) == 2  # H100 and A100: 3 repeats each
    first = re.search(r'<g class="legend([^"]*)" data-series="([^"]*)"', dom)
    assert first.group(1) == " off"
    assert re.search(rf'<g data-series="{re.escape(first.group(2))}" class="hidden">', dom)


def test_json_carries_the_decision(pair):
    data = json.loads(report(str(pair), "--format", "json"))
    texts = [block["text"] for block in data["decision"] if "text" in block]
    assert any(text.startswith("Faster: NVIDIA H100 80GB HBM3, 2.00x") for text in texts)
    table = next(block["table"] for block in data["decision"] if "table" in block)
    rows = {row["device"]: row for row in table}
    # the figures as numbers with their units, not as the Markdown writes them ("$6.88", "0.500")
    assert {device: row["ratio to fastest"] for device, row in rows.items()} == {
        "NVIDIA A100-SXM4-40GB": 0.5, "NVIDIA H100 80GB HBM3": 1.0}
    h100 = rows["NVIDIA H100 80GB HBM3"]
    assert h100["devices charged"] == 1 and h100["runs"] == 3
    assert h100["tokens/s per device (median, min-max)"] == {"value": 1000, "min": 990, "max": 1010}
    assert h100["price/device-h"] == {"value": 6.88, "unit": "USD"}  # the catalog's h100-sxm price
    assert h100["$ per 1M tokens"]["value"] == pytest.approx(6.88 / 3600 / 1000 * 1e6)
    assert h100["J/token"]["value"] is None and h100["J/token"]["reason"].startswith("energy not measured: ")
    days = 20 * TINY_PARAMETERS / (1000 * 1.9 ** 3) / 86400  # as test_projection_uses_the_fitted_scaling...
    assert h100["days on 8"] == pytest.approx(days)
    assert h100["cost on 8"] == {"value": pytest.approx(6.88 * 8 * days * 24), "unit": "USD"}
    fitted = next(block["table"] for block in data["decision"] if "efficiency vs ideal" in block.get("table", [{}])[0])
    assert fitted[1]["efficiency vs ideal"] == {"value": pytest.approx(0.95), "unit": "fraction"}


def test_cpu_energy_of_one_socket_covers_its_ranks(tmp_path):
    """RAPL telemetry of a 2-rank CPU run reads one socket: with devices_used 1 it covers the run
    (telemetry in the shape of GPU telemetry, set by hand: this machine exposes no RAPL counter)."""
    cpu = {"backend": "cpu", "device_model": "AMD EPYC", "catalog_entry": None, "price_usd_per_hour": None}
    data = result("20261121T000000Z-tiny-cpu-rapl", cpu, 2, 900, 1, devices_used=1,
                  devices_used_basis="1 CPU socket (2 ranks)")
    data["metrics"]["telemetry"] = {"source": "rapl", "available": True, "energy_j": 300.0,
                                    "power_w_mean_total": 60.0,
                                    "devices": [{"index": 0, "energy_j": 300.0, "power_w_mean": 60.0}]}
    row = json.loads(report(str(write(tmp_path / "rapl", data)), "--format", "json"))["runs"][0]
    spec = data["spec"]
    assert row["energy_per_token_j"] == pytest.approx(300.0 / (spec["global_batch_size"] * spec["seq_length"]
                                                               * data["metrics"]["timed_steps"]))
    assert row["devices_charged_basis"] == "1 CPU socket (2 ranks)"


def test_a_catalog_price_needs_its_source_and_date(tmp_path, monkeypatch):
    from hwbench.catalog import CatalogError, load_catalog

    entry = (REPO / "hwbench" / "catalogs" / "devices" / "h100-sxm.yaml").read_text()
    (tmp_path / "devices").mkdir()
    mine = tmp_path / "devices" / "h100-sxm.yaml"
    monkeypatch.setenv("HWBENCH_CATALOG_PATH", str(tmp_path))
    mine.write_text("\n".join(line for line in entry.splitlines() if not line.startswith("price_source")) + "\n")
    with pytest.raises(CatalogError, match="price_source: must be given with price_date"):
        load_catalog()
    mine.write_text(entry.replace("price_date: '2026-08-26'", "price_date: 'last week'"))
    with pytest.raises(CatalogError, match="price_date: must be a date written YYYY-MM-DD, not 'last week'"):
        load_catalog()
    monkeypatch.delenv("HWBENCH_CATALOG_PATH")
    # every shipped entry has a price with its source and date, or says why it has none
    for name, device in load_catalog().devices.items():
        if device.price_usd_per_hour is None:
            assert device.price_unavailable, name
        else:
            assert device.price_source and "$" in device.price_source and device.price_date, name


@pytest.mark.parametrize("options, message", [
    ({"projection_devices": 0}, "--projection-devices 0 is not accepted"),
    ({"tokens": -1}, "--tokens -1 is not accepted"),
    ({"prices": {"h100-sxm": -5}}, "--price h100-sxm=-5 is not accepted"),
    ({"prices": {"x": "abc"}}, "--price x='abc' is not accepted")])
def test_the_python_api_checks_what_the_command_line_checks(pair, options, message):
    import hwbench.api

    with pytest.raises(UsageError, match=message):
        hwbench.api.write_report([str(pair)], **options)


def test_a_zero_throughput_is_reported_not_fitted(tmp_path):
    folder = write(tmp_path / "zero", *[result(f"2026112{i}T000000Z-tiny-cuda-z{i}", H100, 1, 0, i, devices_used=1)
                                        for i in range(2)])
    assert "## Decision" in report(str(folder), "--tokens", "1e9")  # no math domain error from log2(0)


def test_a_price_for_no_measured_device_is_noted_whatever_its_source(tmp_path, pair):
    prices = tmp_path / "prices.yaml"
    prices.write_text("typo-gpu: {usd_per_hour: 2.0, source: AWS list price}\n")
    data = json.loads(report(str(pair), "--format", "json", "--prices", str(prices), "--price", "other-typo=1"))
    unmatched = "the price of 'typo-gpu' (--price or --prices) matched no run's catalog entry or device model"
    assert unmatched in data["notes"]
    assert (
        "the price of 'other-typo' (--price or --prices) matched no run's catalog entry or device model"
        in data["notes"]
    )


def test_best_points_of_different_settings_say_what_differs(tmp_path):
    """The H100's runs at seq 64, the A100's at seq 128: one table, but each row names its setting,
    and a sentence says the devices were not compared at the same settings."""
    h100 = [
        result(f"2026112{i}T000000Z-tiny-cuda-h1{i}", H100, 1, t, i, devices_used=1)
        for i, t in enumerate((1000, 1010, 990))
    ]
    for data in h100:
        data["spec"]["seq_length"] = 64
    a100 = [
        result(f"2026112{i}T030000Z-tiny-cuda-a1{i}", A100, 1, t, i, devices_used=1)
        for i, t in enumerate((500, 505, 495))
    ]
    seq = a100[0]["spec"]["seq_length"]
    assert seq != 64
    decision = report(str(write(tmp_path / "seqs", *h100, *a100))).split("## Decision")[1].split("## Runs")[0]
    rows = {
        line.split("|")[1].strip(): line.split("|")[2].strip()
        for line in decision.splitlines()
        if line.startswith("| NVIDIA") and " ranks" in line  # the best points' table, not the peaks'
    }
    assert rows == {
        "NVIDIA H100 80GB HBM3": "TP1 PP1 DP1 x1 ranks, seq 64",
        "NVIDIA A100-SXM4-40GB": f"TP1 PP1 DP1 x1 ranks, seq {seq}",
    }
    assert (
        f"The best points differ in more than device and layout: NVIDIA A100-SXM4-40GB: seq {seq}; NVIDIA H100 "
        "80GB HBM3: seq 64. Each device is compared at its own best settings, not at the same ones."
    ) in decision
    page = report(str(tmp_path / "seqs"), "--format", "html")
    chart = page.split('<section id="decision">')[1].split("</section>")[0].split('<svg class="chart"')[1]
    labels = re.findall(r"<text[^>]*>([^<]*)</text>", chart)
    assert "seq 64" in labels and f"seq {seq}" in labels  # each bar's label names its setting
    loss = next(svg for svg in page.split('<svg class="chart"')[1:] if "training loss" in svg.split(">")[0])
    legends = set(re.findall(r'<g class="legend[^"]*" data-series="([^"]*)"', loss))
    assert (
        len(legends) == 6
        and all(", seq 64 (" in name for name in legends if "H100" in name)
        and all(f", seq {seq} (" in name for name in legends if "A100" in name)
    )


def test_best_points_of_the_same_settings_name_no_setting(pair):
    decision = report(str(pair)).split("## Decision")[1].split("## Runs")[0]
    assert "differ in more than device and layout" not in decision
    assert "| TP1 PP1 DP1 x1 ranks " in decision


def test_runs_at_two_sequence_lengths_are_not_one_scaling_curve(tmp_path):
    """One H100 at seq 64 and two at seq 128: two workloads, each measured at one device count, so
    no scaling is fitted across them (a fit would read the change of workload as scaling)."""
    one = [
        result(f"2026112{i}T000000Z-tiny-cuda-h1{i}", H100, 1, t, i, devices_used=1)
        for i, t in enumerate((1000, 1010, 990))
    ]
    for data in one:
        data["spec"]["seq_length"] = 64
    two = [
        result(f"2026112{i}T010000Z-tiny-cuda-h2{i}", H100, 2, t, i, devices_used=2)
        for i, t in enumerate((1900, 1920, 1880))
    ]
    assert two[0]["spec"]["seq_length"] != 64
    folder = write(tmp_path / "seqs", *one, *two)
    decision = report(str(folder)).split("## Decision")[1].split("## Runs")[0]
    row = next(line for line in decision.splitlines() if line.startswith("| NVIDIA H100"))
    assert row.rstrip(" |").endswith("one device count: linear") and "fitted" not in decision
    page = report(str(folder), "--format", "html")
    assert "scaling with devices charged" not in page
    # the same two counts at one sequence length are fitted
    for data in two:
        data["spec"]["seq_length"] = 64
    same = report(str(write(tmp_path / "same", *one, *two))).split("## Decision")[1].split("## Runs")[0]
    assert "fitted: " in next(line for line in same.splitlines() if line.startswith("| NVIDIA H100"))


def test_a_published_row_at_another_sequence_length_is_said_to_be_another_workload(tmp_path):
    """tiny measured at its seq against a published row at seq 1024: the ratio is given, with the
    two lengths and that it is not the same workload; the published row's point names its length."""
    header = (REPO / "results" / "published" / "table3.csv").read_text().splitlines()[0]
    tables = tmp_path / "tables"
    tables.mkdir()
    (tables / "table9.csv").write_text(
        header + "\n9,8p-GPU(A),tiny,7M,gpu-a100,8,1,1,1024,8,64,fp32,false,,100,10,a made-up row for this test\n"
    )
    runs = [
        result(f"2026112{i}T000000Z-tiny-cuda-h1{i}", H100, 1, t, i, devices_used=1)
        for i, t in enumerate((1000, 1010, 990))
    ]
    seq = runs[0]["spec"]["seq_length"]
    assert seq != 1024
    decision = report(str(write(tmp_path / "runs", *runs)), "--against", str(tables))
    decision = decision.split("## Decision")[1].split("## Runs")[0]
    assert (
        f"x 8p-GPU(A) (gpu-a100, fp32, Table 9; priced as catalog a100-sxm) (at seq {seq} against its 1024: "
        "not the same workload)" in decision
    )
    published = next(line for line in decision.splitlines() if line.startswith("| published 8p-GPU(A)"))
    assert "| TP1 PP1 on 8, seq 1024 " in published


def test_each_device_is_shown_with_its_catalog_entry_and_the_peak_its_mfu_used(tmp_path):
    """The peak a run measured its MFU against is the result's own (what the catalog said when it
    ran); without one, the catalog's figure or why it has none, and why there is no MFU."""
    from hwbench.catalog import load_catalog

    h100 = result("20261120T000000Z-tiny-cuda-h", H100, 1, 1000, 0)
    h100["device"].update(peak_flops=67e12, peak_flops_basis="h100-sxm fp32: as the catalog read when it ran")
    h100["metrics"]["mfu"] = 0.25
    a100 = result("20261120T000000Z-tiny-cuda-a", A100, 1, 500, 0)
    a100["metrics"]["unmeasured"]["mfu"] = "the power limit could not be read"
    data = json.loads(report(str(write(tmp_path / "runs", h100, a100)), "--format", "json"))
    peaks = next(block["table"] for block in data["decision"] if "catalog entry" in block.get("table", [{}])[0])
    rows = {row["device"]: row for row in peaks}
    assert rows["NVIDIA H100 80GB HBM3"] == {
        "device": "NVIDIA H100 80GB HBM3", "catalog entry": "h100-sxm (NVIDIA H100 SXM5 80GB)",
        "peak per device (fp32) and its source": "h100-sxm fp32: as the catalog read when it ran",
        "MFU": "MFU measured against this peak"}
    a100_fp32 = load_catalog().devices["a100-sxm"].peak_flops["fp32"]
    assert rows["NVIDIA A100-SXM4-40GB"]["peak per device (fp32) and its source"] == \
        f"a100-sxm fp32: {a100_fp32.describe()}" and a100_fp32.source in a100_fp32.describe()
    assert rows["NVIDIA A100-SXM4-40GB"]["MFU"] == "no MFU: the power limit could not be read"


def cells(section: str, first: str) -> list[list[str]]:
    """The cells of the table rows of ``section`` (markdown) whose first cell is ``first``."""
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ")]
    return [row for row in rows if row[0] == first]


def test_a_simulated_device_is_shown_but_never_named_faster_cheaper_or_projected(tmp_path):
    """An H100 through the CUDA stand-in (the vendor's code path on this host), twice as fast as
    the real H100 beside it, its catalog entry priced, its telemetry and time to target recorded as
    the stand-in answered: on the whole page it is shown and marked, a candidate of its own (never
    pooled with the real H100), never named faster or cheaper, and never priced, projected, given
    J/token or a cost to its target."""
    runs = [result(f"2026112{i}T000000Z-tiny-cuda-a1{i}", A100, 1, t, i) for i, t in enumerate((500, 505, 495))]
    runs += [result(f"2026112{i}T010000Z-tiny-cuda-h1{i}", H100, 1, t, i) for i, t in enumerate((1000, 1010, 990))]
    stand_in = [result(f"2026112{i}T020000Z-tiny-cuda-s1{i}", H100, 1, t, i) for i, t in enumerate((2000, 2020, 1980))]
    for data in stand_in:
        data["device"]["simulated"] = data["environment"]["simulated"] = True
        data["metrics"]["telemetry"] = {"source": "nvml", "available": True, "energy_j": 880.0,
                                        "power_w_mean_total": 88.0,
                                        "devices": [{"index": 0, "energy_j": 880.0, "power_w_mean": 88.0}]}
        data["metrics"]["time_to_target"] = {"metric": "loss", "given": "loss 9", "value": 8.9, "reached": True,
                                             "step": 2, "samples": 16, "time_s": 10.0, "scored_time_s": 10.0,
                                             "device_hours": 10 / 3600, "energy_j": 880.0}
    page = report(str(write(tmp_path / "mixed", *runs, *stand_in)))
    sections = {part.split("\n", 1)[0]: part for part in page.split("\n## ")}
    decision, simulated = sections["Decision"], "NVIDIA H100 80GB HBM3 [simulated]"
    assert "Faster: NVIDIA H100 80GB HBM3, 2.00x the tokens/s per device of NVIDIA A100-SXM4-40GB" in decision
    assert "Cheaper: NVIDIA A100-SXM4-40GB" in decision and f"Faster: {simulated}" not in decision
    assert (f"Left out of every verdict: {simulated}: a stand-in ran the vendor's code path on this host") in decision
    assert f"{simulated}: not projected: a simulated device (a stand-in's figures measure this host" in decision
    assert f"- {simulated}: not priced: a simulated device" in decision
    row = cells(decision, simulated)[0]  # the candidates' table (the time to target's follows)
    # runs, tokens/s per device, ratio to fastest, price, $ per 1M, J/token, days, cost on 8
    assert (row[3], row[4].split()[0], row[7], row[8], row[9].split(" [")[0], row[10], row[11]) == \
        ("3", "2,000.0", "no price", "no price", "not measured", "-", "no price")
    real = cells(decision, "NVIDIA H100 80GB HBM3")[0]
    assert real[3] == "3" and real[4].startswith("1,000.0") and real[7] == "$6.88"  # the real runs alone
    stand_in_runs = [row for data in stand_in for row in cells(sections["Runs"], data["run_id"])]
    assert len(stand_in_runs) == 3 and all(row[3] == "NVIDIA H100 80GB HBM3 x1 [simulated]" for row in stand_in_runs)
    procurement = sections["Procurement"]
    for data in stand_in:
        [row] = cells(procurement, data["run_id"])
        # J/token, avg power, price, $ per 1M tokens, days, projected cost
        assert [row[4].split(" [")[0], row[5], row[6].split(" [")[0], row[7], row[9], row[10]] == \
            ["not measured", "not measured", "no price", "no price", "-", "no price"], row
    assert "energy not measured: not counted: a simulated device" in procurement
    assert "no price: not priced: a simulated device" in procurement
    assert "scaling: not projected: a simulated device" in procurement
    [target] = cells(sections["Time to target"], simulated)
    assert target[8].startswith("not measured (not counted: a simulated device") and target[9].startswith("no price")


def test_runs_of_one_point_in_two_environments_are_two_samples_as_in_the_history(tmp_path):
    """Nine H100 runs of one point, six with one thread per rank and three with two: the decision
    pooled them as one best point (CV 34.5% on a real sweep); it keys samples as the history does
    (point and the environment fields that move figures by themselves), so the best sample is the
    two-thread runs alone, and the point says what set them apart and how many runs were left out."""
    tuning = json.loads(SOURCE.read_text())["environment"]["tuning"]
    runs = [result(f"2026112{i}T000000Z-tiny-cuda-a{i}", A100, 1, t, i) for i, t in enumerate((500, 505, 495))]
    runs += [result(f"2026112{i % 3}T01{i}000Z-tiny-cuda-one{i}", H100, 1, t, i,
                    tuning={**tuning, "intra_op_threads": 1}, threads_per_rank=1)
             for i, t in enumerate((1000, 1010, 990, 1005, 995, 1000))]
    runs += [result(f"2026112{i}T020000Z-tiny-cuda-two{i}", H100, 1, t, i,
                    tuning={**tuning, "intra_op_threads": 2}, threads_per_rank=2)
             for i, t in enumerate((1900, 1920, 1880))]
    decision = report(str(write(tmp_path / "threads", *runs))).split("## Decision")[1].split("## Runs")[0]
    row = cells(decision, "NVIDIA H100 80GB HBM3")[0]
    assert row[1] == ("TP1 PP1 DP1 x1 ranks, tuning intra_op_threads=2 (6 run(s) of this point in another "
                      "environment: a sample of their own, not pooled)")
    assert (row[3], row[4], row[5]) == ("3", "1,900.0 (1,880.0-1,920.0)", "1.1%")
    assert ("Faster: NVIDIA H100 80GB HBM3, 3.80x the tokens/s per device of NVIDIA A100-SXM4-40GB; shown by the "
            "repeats (3 and 3 runs; p=0.1 (exact U=0), separated).") in decision
