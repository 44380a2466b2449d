//! The SVG plot of a `ple bench steady` run (`--svg`).

/// One point of the plot: a report interval.
pub struct Point {
    pub step: u64,
    pub hit: f64,
    pub lru_rows: f64,
    pub lru_pages: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// A series of the plot: name, colour, values.
type Series<'a> = (&'a str, &'a str, Vec<f64>);
/// A panel of the plot: top, label, top of the y axis, series.
type Panel<'a> = (f64, &'a str, f64, Vec<Series<'a>>);

/// The run's plot: hit rates (the cache, LRU of rows, LRU of pages) and step latency
/// (p50, p99) per interval, over the steps. Hand-written SVG, two panels.
pub fn svg(points: &[Point], title: &str) -> String {
    let (w, h, m) = (900.0f64, 300.0f64, 60.0f64);
    let xmax = points.last().map_or(1, |p| p.step).max(1) as f64;
    let x = |s: u64| m + (w - 2.0 * m) * s as f64 / xmax;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{m}\" y=\"20\" font-size=\"14\">{}</text>\n",
        2.0 * h + 40.0,
        xml_escape(title)
    );
    let lat_max = points
        .iter()
        .map(|p| p.p99_us)
        .fold(1.0f64, f64::max)
        .max(1.0);
    let panels: [Panel; 2] = [
        (
            30.0,
            "hit rate %",
            100.0,
            vec![
                (
                    "row cache",
                    "#d62728",
                    points.iter().map(|p| p.hit * 100.0).collect(),
                ),
                (
                    "LRU rows",
                    "#1f77b4",
                    points.iter().map(|p| p.lru_rows * 100.0).collect(),
                ),
                (
                    "LRU pages",
                    "#7f7f7f",
                    points.iter().map(|p| p.lru_pages * 100.0).collect(),
                ),
            ],
        ),
        (
            h + 40.0,
            "step latency µs",
            lat_max * 1.05,
            vec![
                ("p50", "#2ca02c", points.iter().map(|p| p.p50_us).collect()),
                ("p99", "#9467bd", points.iter().map(|p| p.p99_us).collect()),
            ],
        ),
    ];
    for (top, label, ymax, series) in panels {
        let y = |v: f64| top + (h - 40.0) * (1.0 - v / ymax);
        out += &format!(
            "<rect x=\"{m}\" y=\"{top}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#999\"/>\n\
             <text x=\"5\" y=\"{}\">{label}</text>\n<text x=\"5\" y=\"{}\">{ymax:.0}</text>\n\
             <text x=\"5\" y=\"{}\">0</text>\n<text x=\"{}\" y=\"{}\">step {xmax:.0}</text>\n",
            w - 2.0 * m,
            h - 40.0,
            top + (h - 40.0) / 2.0,
            top + 10.0,
            top + h - 40.0,
            w - m - 60.0,
            top + h - 25.0,
        );
        for (k, (name, color, v)) in series.iter().enumerate() {
            let pts: Vec<String> = points
                .iter()
                .zip(v)
                .map(|(p, &v)| format!("{:.1},{:.1}", x(p.step), y(v.clamp(0.0, ymax))))
                .collect();
            out += &format!(
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>\n\
                 <text x=\"{}\" y=\"{}\" fill=\"{color}\">{name}</text>\n",
                pts.join(" "),
                m + 10.0 + 110.0 * k as f64,
                top + h - 25.0,
            );
        }
    }
    out + "</svg>\n"
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
