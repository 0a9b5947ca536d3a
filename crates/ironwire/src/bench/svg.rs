//! Line charts as SVG text, for `bench report`: one x axis of I/O sizes
//! (log 2 spaced, each size a tick), a linear y axis from zero, a legend.
//! No dependencies; the output opens in any browser and renders on GitHub.

use std::fmt::Write;

/// One line of a chart.
pub struct Series {
    pub name: String,
    /// (x, y); x is an I/O size in bytes.
    pub points: Vec<(u64, f64)>,
    /// Drawn dashed (the ceiling beside a measured line).
    pub dashed: bool,
}

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 190.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;
const COLOURS: [&str; 6] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"];

/// A size in bytes as the papers label it: 4K, 256K, 1M.
pub fn size_label(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}

/// A round step for about five y ticks up to `max`.
fn y_step(max: f64) -> f64 {
    if max <= 0.0 || !max.is_finite() {
        return 1.0;
    }
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let n = raw / mag;
    let nice = if n <= 1.0 {
        1.0
    } else if n <= 2.0 {
        2.0
    } else if n <= 2.5 {
        2.5
    } else if n <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// The chart as a complete SVG document.
pub fn line_chart(title: &str, y_label: &str, series: &[Series]) -> String {
    let mut xs: Vec<u64> = series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).filter(|&x| x > 0).collect();
    xs.sort_unstable();
    xs.dedup();
    let (lo, hi) = match (xs.first(), xs.last()) {
        (Some(&a), Some(&b)) => ((a as f64).log2(), (b as f64).log2()),
        _ => (0.0, 1.0),
    };
    let span = if hi > lo { hi - lo } else { 1.0 };
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x_of = |x: u64| LEFT + ((x.max(1) as f64).log2() - lo) / span * plot_w;
    let y_max_data =
        series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).filter(|y| y.is_finite()).fold(0.0, f64::max);
    let step = y_step(y_max_data);
    let y_max = (y_max_data / step).ceil().max(1.0) * step;
    let y_of = |y: f64| TOP + plot_h - (y.clamp(0.0, y_max) / y_max) * plot_h;

    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#);
    let _ = writeln!(
        o,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        LEFT + plot_w / 2.0,
        escape(title)
    );
    // Grid and y ticks.
    let ticks = (y_max / step).round() as usize;
    for i in 0..=ticks {
        let v = step * i as f64;
        let y = y_of(v);
        let _ = writeln!(
            o,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            y + 4.0,
            trim_float(v)
        );
    }
    // X ticks.
    for &x in &xs {
        let px = x_of(x);
        let _ = writeln!(
            o,
            r##"<line x1="{px:.1}" y1="{:.1}" x2="{px:.1}" y2="{:.1}" stroke="#888"/><text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            TOP + plot_h,
            TOP + plot_h + 5.0,
            TOP + plot_h + 19.0,
            size_label(x)
        );
    }
    let _ =
        writeln!(o, r##"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#444"/>"##);
    let _ = writeln!(
        o,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">I/O size</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 18.0
    );
    let _ = writeln!(
        o,
        r#"<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        TOP + plot_h / 2.0,
        escape(y_label)
    );
    // Lines, points, legend.
    for (i, s) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let dash = if s.dashed { r#" stroke-dasharray="6 4""# } else { "" };
        let pts: Vec<String> = s
            .points
            .iter()
            .filter(|p| p.1.is_finite())
            .map(|&(x, y)| format!("{:.1},{:.1}", x_of(x), y_of(y)))
            .collect();
        let _ = writeln!(
            o,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} points="{}"/>"#,
            pts.join(" ")
        );
        for p in &pts {
            if let Some((x, y)) = p.split_once(',') {
                let _ = writeln!(o, r#"<circle cx="{x}" cy="{y}" r="3" fill="{colour}"/>"#);
            }
        }
        let ly = TOP + 10.0 + 20.0 * i as f64;
        let lx = LEFT + plot_w + 14.0;
        let _ = writeln!(
            o,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{colour}" stroke-width="2"{dash}/><text x="{}" y="{}">{}</text>"#,
            lx + 26.0,
            lx + 32.0,
            ly + 4.0,
            escape(&s.name)
        );
    }
    o.push_str("</svg>\n");
    o
}

fn trim_float(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_labelled_like_the_papers() {
        assert_eq!(size_label(4096), "4K");
        assert_eq!(size_label(262_144), "256K");
        assert_eq!(size_label(1 << 20), "1M");
        assert_eq!(size_label(512), "512");
    }

    #[test]
    fn y_steps_are_round() {
        assert_eq!(y_step(9.0), 2.0);
        assert_eq!(y_step(100.0), 20.0);
        assert_eq!(y_step(0.9), 0.2);
        assert_eq!(y_step(0.0), 1.0);
    }

    #[test]
    fn chart_places_points_inside_the_plot() {
        let s = vec![
            Series { name: "read".into(), points: vec![(4096, 1.0), (65536, 5.0), (262_144, 9.0)], dashed: false },
            Series { name: "ceiling <read>".into(), points: vec![(4096, 2.0), (262_144, 10.0)], dashed: true },
        ];
        let svg = line_chart("Bandwidth", "Gbit/s", &s);
        assert!(svg.starts_with("<svg ") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 5);
        assert_eq!(svg.matches("stroke-dasharray").count(), 2, "the dashed line and its legend");
        assert!(svg.contains("ceiling &lt;read&gt;"));
        for label in ["4K", "64K", "256K"] {
            assert!(svg.contains(&format!(">{label}</text>")), "{label}");
        }
        // 4K sits on the left edge, 256K on the right; 10 (the top tick)
        // on the top edge.
        assert!(svg.contains(&format!("{LEFT:.1},")));
        assert!(svg.contains(&format!("{:.1},{TOP:.1}", WIDTH - RIGHT)));
        for c in svg.split("<circle cx=\"").skip(1) {
            let x: f64 = c.split('"').next().and_then(|v| v.parse().ok()).expect("cx");
            assert!((LEFT..=WIDTH - RIGHT).contains(&x), "{x}");
        }
    }
}
