use super::*;

/// A real trace (tracefs, `global` clock) of perftest's one-node `ib_write_lat` under
/// `RUN_TO_PARITY` in a run stuck at ~4 ms: the header, then one round trip's stall. On CPU 1,
/// ib_write_lat (PID 225) queues rxe's work and wakes kworker/u8:1 (PID 30) onto CPU 0, where
/// the other ib_write_lat (218) spins; the kworker runs only when 218 is switched out still
/// runnable 8 ms later (two ticks at HZ=250). The wake-ups on CPU 0 by CPU 0 that follow run
/// at once.
const EXCERPT: &str = include_str!("testdata/sched-trace-excerpt.txt");

const MS: u64 = 1_000_000;

#[test]
fn a_line_is_read_into_its_fields() {
    let e = parse_line(
        "    kworker/u8:0-12      [000] d..4.    22.017219: sched_waking: comm=kworker/u8:0 \
         pid=12 prio=120 target_cpu=000",
    )
    .unwrap();
    assert_eq!(e.pid, 12);
    assert_eq!(e.cpu, 0);
    assert_eq!(e.ns, 22_017_219_000);
    assert_eq!(e.name, "sched_waking");
    assert_eq!(field(e.body, "target_cpu"), Some("000"));
    assert_eq!(field(e.body, "comm"), Some("kworker/u8:0"));
    // The idle task, a name with spaces and brackets, nanosecond clocks; comments are skipped.
    let e =
        parse_line("          <idle>-0       [001] dNh2.  7.000000001: sched_wakeup: x=1").unwrap();
    assert_eq!((e.pid, e.cpu, e.ns), (0, 1, 7_000_000_001));
    let e = parse_line(" a [b] c-7 [003] ..... 1.5: sched_switch: y").unwrap();
    assert_eq!((e.pid, e.cpu, e.ns, e.body), (7, 3, 1_500_000_000, "y"));
    assert_eq!(
        parse_line("#           TASK-PID     CPU#  |||||  TIMESTAMP  FUNCTION"),
        None
    );
    assert_eq!(
        parse_line("# entries-in-buffer/entries-written: 19397/19397   #P:2"),
        None
    );
}

#[test]
fn the_excerpt_shows_one_kworker_waiting_two_ticks_behind_a_spinner() {
    let s = analyse(EXCERPT);
    assert_eq!(s.kworkers, BTreeSet::from([12, 30]));
    let long: Vec<&Wait> = s.long_waits(MS).collect();
    assert_eq!(long.len(), 1, "{:#?}", s.waits);
    let w = long[0];
    assert_eq!((w.pid, w.cpu, w.woken, w.waker_cpu), (30, 0, true, Some(1)));
    assert_eq!(s.remote_wakes(MS), 1);
    // Traced before the IPI events were: no IPI known.
    assert_eq!(w.ipi_taken_after, None);
    assert_eq!(w.from_ns, 22_008_998_000);
    assert_eq!(w.ns, 22_017_075_000 - 22_008_998_000);
    assert_eq!(w.ran, vec![("ib_write_lat".to_string(), w.ns)]);
    assert_eq!(
        s.main_occupant(MS),
        Some(("ib_write_lat".to_string(), w.ns))
    );
    // Every other wake-up in the excerpt is one on CPU 0 by CPU 0, run within 0.2 ms.
    assert_eq!(s.waits.len(), 3, "{:#?}", s.waits);
    assert!(s.waits.iter().filter(|x| *x != w).all(|x| x.ns < MS / 5));
    // rxe's work item queued at 22.008991 started at 22.017116: the only one delayed.
    assert_eq!(s.long_work_delays(MS), 1);
    assert!(s.work_delays.contains(&(22_017_116_000 - 22_008_991_000)));
}

#[test]
fn a_preempted_kworker_waits_from_its_switch_out() {
    let t = "\
 kworker/u8:0-12 [000] ..... 1.000000: workqueue_execute_start: work struct 01: function do_work [rdma_rxe]
 kworker/u8:0-12 [000] d..2. 1.000100: sched_switch: prev_comm=kworker/u8:0 prev_pid=12 prev_prio=120 prev_state=R+ ==> next_comm=spin next_pid=9 next_prio=120
 spin-9 [000] d..2. 1.004100: sched_switch: prev_comm=spin prev_pid=9 prev_prio=120 prev_state=R ==> next_comm=kworker/u8:0 next_pid=12 next_prio=120
";
    let s = analyse(t);
    assert_eq!(s.waits.len(), 1);
    let w = &s.waits[0];
    assert_eq!(
        (w.pid, w.woken, w.waker_cpu, w.ns),
        (12, false, None, 4 * MS)
    );
    assert_eq!(s.remote_wakes(MS), 0);
    assert_eq!(w.ran, vec![("spin".to_string(), 4 * MS)]);
    // A task that never ran rxe's work is not counted.
    assert!(analyse(&t.replace("[rdma_rxe]", "[other]"))
        .waits
        .is_empty());
}

/// A real trace as above, with the reschedule IPIs traced (`ipi_send_cpu`,
/// `reschedule_entry`): twice a kworker on one CPU wakes another kworker onto the other CPU,
/// where an ib_write_lat spins; each time the scheduler asks that CPU to reschedule at once
/// (an IPI from `wakeup_preempt`), and each time the kworker runs 3.3 and 2.9 ms later.
const IPI_EXCERPT: &str = include_str!("testdata/sched-trace-ipi-excerpt.txt");

#[test]
fn the_ipi_excerpt_shows_the_reschedule_asked_at_once_and_taken_late() {
    let s = analyse(IPI_EXCERPT);
    let long: Vec<&Wait> = s.long_waits(2 * MS).collect();
    assert_eq!(long.len(), 2, "{:#?}", s.waits);
    assert_eq!(s.remote_wakes(2 * MS), 2);
    // kworker/u8:2 woken from CPU 1 onto CPU 0: IPI at 66.184496, taken at 66.184974,
    // switched in at 66.187720.
    let a = long[0];
    assert_eq!((a.pid, a.cpu, a.waker_cpu), (37, 0, Some(1)));
    assert_eq!(a.ns, 66_187_720_000 - 66_184_443_000);
    assert_eq!(
        a.ipi_taken_after,
        Some(Some(66_184_974_000 - 66_184_496_000))
    );
    // kworker/u8:0 woken from CPU 0 onto CPU 1: IPI at 66.189949, taken at 66.192323.
    let b = long[1];
    assert_eq!((b.pid, b.cpu, b.waker_cpu), (12, 1, Some(0)));
    assert_eq!(
        b.ipi_taken_after,
        Some(Some(66_192_323_000 - 66_189_949_000))
    );
    assert_eq!(s.ipis(2 * MS), (2, vec![478_000, 2_374_000]));
    // The wake-ups on a CPU by itself need no IPI (one of them took 1.7 ms all the same).
    assert!(s
        .waits
        .iter()
        .filter(|w| w.waker_cpu == Some(w.cpu))
        .all(|w| w.ipi_taken_after.is_none()));
}
