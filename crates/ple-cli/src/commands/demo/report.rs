//! The demo's latency chart.

use super::replay::PassReport;

/// The per-step latency of the cold and the warm pass as an SVG line chart.
pub(super) fn svg(cold: &PassReport, warm: &PassReport) -> String {
    let (w, h, pad) = (760.0, 360.0, 50.0);
    let n = cold.step_ms.len().max(2);
    let max = cold
        .step_ms
        .iter()
        .chain(&warm.step_ms)
        .cloned()
        .fold(0.001f64, f64::max);
    let (lo, hi) = (
        (0.001f64)
            .max(
                warm.step_ms
                    .iter()
                    .chain(&cold.step_ms)
                    .cloned()
                    .fold(f64::MAX, f64::min),
            )
            .log10()
            .floor(),
        max.log10().ceil(),
    );
    let y =
        |v: f64| pad + (h - 2.0 * pad) * (1.0 - (v.max(1e-3).log10() - lo) / (hi - lo).max(1e-9));
    let x = |i: usize| pad + (w - 2.0 * pad) * i as f64 / (n - 1) as f64;
    let line = |v: &[f64], color: &str| {
        let pts: Vec<String> = v
            .iter()
            .enumerate()
            .map(|(i, &m)| format!("{:.1},{:.1}", x(i), y(m)))
            .collect();
        format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"/>",
            pts.join(" ")
        )
    };
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    s += &format!(
        "<text x=\"{pad}\" y=\"20\" font-size=\"14\">libple demo: step latency, submit to rows ready (log scale)</text>\n"
    );
    let mut e = lo;
    while e <= hi {
        let v = 10f64.powf(e);
        s += &format!(
            "<line x1=\"{pad}\" x2=\"{}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/><text x=\"5\" y=\"{:.1}\">{} ms</text>\n",
            w - pad,
            y(v),
            y(v),
            y(v) + 4.0,
            v
        );
        e += 1.0;
    }
    s += &format!(
        "<text x=\"{}\" y=\"{}\">engine step (1 = 2,048-token prefill, 2 = prompts, then decode)</text>\n",
        pad,
        h - 12.0
    );
    s += &line(&cold.step_ms, "#d62728");
    s += &line(&warm.step_ms, "#1f77b4");
    s += &format!(
        "<text x=\"{}\" y=\"40\" fill=\"#d62728\">cold (pages evicted)</text><text x=\"{}\" y=\"56\" fill=\"#1f77b4\">warm (page cache)</text>\n</svg>\n",
        w - 230.0,
        w - 230.0
    );
    s
}
