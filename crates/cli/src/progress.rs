//! A progress bar on stderr that appears only for runs over a second, never with --quiet, and
//! never when stderr is not a terminal.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub struct Progress {
    bar: ProgressBar,
    start: Instant,
    enabled: bool,
    shown: AtomicBool,
}

impl Progress {
    /// `total` in `unit`s when known.
    pub fn new(quiet: bool, total: Option<u64>, unit: &str) -> Self {
        let bar = match total {
            Some(t) => ProgressBar::with_draw_target(Some(t), ProgressDrawTarget::hidden()),
            None => ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden()),
        };
        let tpl = if total.is_some() {
            format!("{{elapsed_precise}} [{{bar:40}}] {{human_pos}}/{{human_len}} {unit} ({{per_sec}}, eta {{eta}}) {{msg}}")
        } else {
            format!("{{elapsed_precise}} {{spinner}} {{human_pos}} {unit} ({{per_sec}})")
        };
        bar.set_style(
            ProgressStyle::with_template(&tpl)
                .expect("valid template")
                .progress_chars("=> "),
        );
        Progress {
            bar,
            start: Instant::now(),
            enabled: !quiet && std::io::stderr().is_terminal(),
            shown: AtomicBool::new(false),
        }
    }

    pub fn set(&self, pos: u64) {
        self.bar.set_position(pos);
        self.show_when_slow();
    }

    /// Shows the bar once the run has taken a second.
    fn show_when_slow(&self) {
        if self.enabled
            && !self.shown.load(Ordering::Relaxed)
            && self.start.elapsed() > Duration::from_secs(1)
            && !self.shown.swap(true, Ordering::Relaxed)
        {
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
            self.bar.enable_steady_tick(Duration::from_millis(200));
        }
    }

    /// Text after the bar (e.g. what the position does not tell).
    pub fn set_message(&self, msg: String) {
        self.bar.set_message(msg);
        self.show_when_slow();
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
