//! The memory this process can still take: MemAvailable, and the cgroup v2 headroom of the
//! process's own cgroup and each of its ancestors (the tightest wins).
//!
//! A cgroup's `memory.current` counts its page cache (kekzl/imp #2070), including the table's
//! pages in MMAP mode; the kernel reclaims clean file pages before it fails a charge, so the
//! headroom is `memory.max - memory.current` plus the reclaimable file pages of `memory.stat`:
//! all of `inactive_file` and half of `active_file` (the working set the kernel keeps longest,
//! counted as MemAvailable counts the global page cache: half of it may not come back cheaply).

/// MemAvailable and the cgroup headroom, the smaller; `None` when neither can be read.
pub fn memory_headroom() -> Option<u64> {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let mem_available = read("/proc/meminfo").and_then(|t| meminfo_available(&t));
    let cgroup = read("/proc/self/cgroup")
        .and_then(|t| cgroup_path(&t))
        .and_then(|path| {
            cgroup_dirs(&path)
                .filter_map(|dir| {
                    let f = |name: &str| read(&format!("{dir}/{name}"));
                    cgroup_headroom(&f("memory.max")?, &f("memory.current")?, f("memory.stat"))
                })
                .min()
        });
    match (mem_available, cgroup) {
        (Some(a), Some(c)) => Some(a.min(c)),
        (a, c) => a.or(c),
    }
}

/// `MemAvailable:` of `/proc/meminfo` text, bytes.
fn meminfo_available(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .and_then(|kb| kb.checked_mul(1024))
}

/// The cgroup v2 path (`0::/path`) of `/proc/self/cgroup` text.
fn cgroup_path(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim().to_string())
}

/// `/sys/fs/cgroup/<path>` and each ancestor up to the root, innermost first.
fn cgroup_dirs(path: &str) -> impl Iterator<Item = String> {
    let parts: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty() && *s != "..")
        .map(str::to_string)
        .collect();
    (0..=parts.len())
        .rev()
        .map(move |n| format!("/sys/fs/cgroup/{}", parts[..n].join("/")))
}

/// One cgroup's headroom from its `memory.max`, `memory.current` and `memory.stat` texts;
/// `None` when it has no limit (`max`) or the files do not parse.
fn cgroup_headroom(max: &str, current: &str, stat: Option<String>) -> Option<u64> {
    let max = max.trim().parse::<u64>().ok()?;
    let cur = current.trim().parse::<u64>().ok()?;
    let field = |name: &str| {
        stat.as_deref()?
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    let reclaimable = field("inactive_file").unwrap_or(0) + field("active_file").unwrap_or(0) / 2;
    Some(max.saturating_sub(cur).saturating_add(reclaimable.min(cur)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "anon 1048576\nfile 6442450944\nkernel 1000\nactive_anon 0\n\
                        inactive_anon 1048576\nactive_file 2147483648\ninactive_file 4294967296\n\
                        file_mapped 100\n";

    #[test]
    fn page_cache_in_a_cgroup_counts_as_headroom() {
        // 8 GiB limit, 7.5 GiB charged of which 4 GiB inactive and 2 GiB active file pages
        let h = cgroup_headroom("8589934592\n", "8053063680\n", Some(STAT.into())).unwrap();
        assert_eq!(h, (512 << 20) + (4 << 30) + (1 << 30));
    }

    #[test]
    fn no_limit_no_stat_and_overcharge() {
        assert_eq!(cgroup_headroom("max\n", "123\n", Some(STAT.into())), None);
        assert_eq!(cgroup_headroom("1000\n", "400\n", None), Some(600));
        // charged above the limit (memory.max lowered): only what can be reclaimed, never more
        // than what is charged
        let stat = "active_file 0\ninactive_file 100\n".to_string();
        assert_eq!(cgroup_headroom("1000\n", "1500\n", Some(stat)), Some(100));
        let stat = "inactive_file 5000\n".to_string();
        assert_eq!(cgroup_headroom("1000\n", "400\n", Some(stat)), Some(1000));
        // a field name that merely starts like another is not read
        let stat = "inactive_file_x 5000\n".to_string();
        assert_eq!(cgroup_headroom("1000\n", "400\n", Some(stat)), Some(600));
    }

    #[test]
    fn cgroup_paths_and_meminfo() {
        let t = "12:cpu:/old\n0::/user.slice/app.scope\n";
        let p = cgroup_path(t).unwrap();
        assert_eq!(p, "/user.slice/app.scope");
        let dirs: Vec<String> = cgroup_dirs(&p).collect();
        assert_eq!(
            dirs,
            [
                "/sys/fs/cgroup/user.slice/app.scope",
                "/sys/fs/cgroup/user.slice",
                "/sys/fs/cgroup/"
            ]
        );
        assert_eq!(cgroup_dirs("/").collect::<Vec<_>>(), ["/sys/fs/cgroup/"]);
        assert_eq!(cgroup_path("1:name=systemd:/x\n"), None);
        let m = "MemTotal:       24000000 kB\nMemAvailable:    1000 kB\n";
        assert_eq!(meminfo_available(m), Some(1024 * 1000));
    }
}
