use super::*;

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

#[test]
fn options_are_read_and_bounded() {
    let r = parse_args(&[]).unwrap();
    assert_eq!((r.runs, r.iters, r.size, r.host_load), (5, 300, 2, 0));
    assert_eq!(r.settings, ["RUN_TO_PARITY", "NO_RUN_TO_PARITY"]);
    let r = parse_args(&args(
        "--runs 3 --settings NO_RUN_TO_PARITY --host-load 2 --stock",
    ))
    .unwrap();
    assert_eq!((r.runs, r.host_load, r.stock), (3, 2, true));
    assert_eq!(r.settings, ["NO_RUN_TO_PARITY"]);
    assert!(parse_args(&args("--runs 0")).is_err());
    assert!(parse_args(&args("--settings PLACE_LAG")).is_err());
    assert!(parse_args(&args("--iters")).is_err());
    assert!(parse_args(&args("--quick")).is_err());
}

/// Lines of a real console (the testbed's own lines and perftest's header cut).
const CONSOLE: &str = "\
### kernel 6.12.117+deb12-amd64
### run perftest.RUN_TO_PARITY.1 begin
---------------------------------------------------------------------------------------
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] 
 2       300          146.84         10080.61      4013.47  	       4334.16     	2050.33		9637.28 		10080.61
---------------------------------------------------------------------------------------
### run perftest.RUN_TO_PARITY.1 end client=0 server=0
### run lat.RUN_TO_PARITY.1 begin
 #bytes  #iterations  t_typical[usec]  t_avg[usec]
 2       300          2002.08          2778.93
RESULT lat_usec=2778.932 typ_usec=2002.080 inline=no region=host async=no
### run lat.RUN_TO_PARITY.1 end client=0 server=0
### run lat-poll.RUN_TO_PARITY.1 begin
### run lat-poll.RUN_TO_PARITY.1 end client=124 server=143
";

#[test]
fn a_console_gives_each_run_its_median_and_statuses() {
    let v = runs(CONSOLE);
    assert_eq!(v.len(), 3);
    assert_eq!(v[0].id, "perftest.RUN_TO_PARITY.1");
    assert_eq!(v[0].median_us, Some(4013.47));
    assert_eq!(v[0].status, "client=0 server=0");
    assert_eq!(v[1].median_us, Some(2002.08));
    assert_eq!(
        (v[2].median_us, v[2].status.as_str()),
        (None, "client=124 server=143")
    );
}
