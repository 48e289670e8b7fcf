//! One mixture-of-experts layer from Rust on the host backend, ranks as
//! processes: the launcher (this program without arguments) makes the
//! unique id and starts each rank (this program again) with it in hex.
//! Rank r's token t picks experts (t + r) % E and (3t + 1 + r) % E with gate
//! weights 0.5 and 0.25; each expert scales its rows by (expert id + 1);
//! combine sums them back. float32 holds every value exactly, so the output
//! must equal the layer computed locally.
//!
//!     cargo run -- [RANKS]
use moeep::{Backend, Comm, Config, Rows, Tokens, UniqueId};
use std::process::{exit, Command};

const T: usize = 32;
const H: usize = 128;
const K: usize = 2;
const E_PER_RANK: usize = 4;

fn rank_main(rank: usize, nranks: usize, id: &UniqueId) -> Result<bool, moeep::Error> {
    let e = E_PER_RANK * nranks;
    let cfg = Config::new(e as i32, H as i32, T as i32, K as i32)
        .backend(Backend::Host)
        .types(moeep::DataType::Float32, moeep::DataType::Float32);
    let comm = Comm::init_rank(nranks as i32, id, rank as i32, &cfg)?;
    let mut x = Rows::<f32>::zeroed(T * H);
    for t in 0..T {
        for j in 0..H {
            x[t * H + j] = ((rank * T + t + j) % 7) as f32 - 3.0;
        }
    }
    let topk: Vec<i64> = (0..T).flat_map(|t| [((t + rank) % e) as i64, ((3 * t + 1 + rank) % e) as i64]).collect();
    let gate: Vec<f32> = (0..T).flat_map(|_| [0.5f32, 0.25]).collect();
    let mut tokens = Tokens::new(&x, &topk, K);
    tokens.topk_weights = Some(&gate);
    let (handle, got) = comm.dispatch(&tokens)?;

    // The experts: each received row scaled by its local experts' (id + 1) and gate weights.
    let (first, _) = comm.local_experts();
    let mut y = Rows::<f32>::zeroed(got.num_recv * H);
    for i in 0..got.num_recv {
        let scale: f32 = (0..K)
            .filter(|&k| got.topk_idx[i * K + k] >= 0)
            .map(|k| got.topk_weights[i * K + k] * (first as i64 + got.topk_idx[i * K + k] + 1) as f32)
            .sum();
        for j in 0..H {
            y[i * H + j] = scale * got.x[i * H + j];
        }
    }
    let (out, _) = comm.combine(&handle, &y, None, None)?;
    let ok = (0..T).all(|t| {
        let scale = 0.5 * (topk[t * K] + 1) as f32 + 0.25 * (topk[t * K + 1] + 1) as f32;
        (0..H).all(|j| out[t * H + j] == scale * x[t * H + j])
    });
    println!("rank {} of {}: received {} rows, combined {} tokens: {}", rank, nranks, got.num_recv, T,
             if ok { "correct" } else { "WRONG" });
    Ok(ok)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{:02x}", b)).collect()
}

fn unhex(text: &str) -> [u8; 128] {
    let mut out = [0u8; 128];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).expect("a unique id in hex");
    }
    out
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() == 4 {
        // A rank: RANKS RANK ID
        let (nranks, rank) = (args[1].parse().unwrap(), args[2].parse().unwrap());
        match rank_main(rank, nranks, &UniqueId::from_bytes(&unhex(&args[3]))) {
            Ok(true) => exit(0),
            Ok(false) => exit(1),
            Err(e) => {
                eprintln!("rank {}: {}", rank, e);
                exit(1)
            }
        }
    }
    let nranks: usize = args.get(1).map_or(2, |n| n.parse().expect("RANKS"));
    // This process serves the bootstrap of the communicator; it waits for the ranks.
    let id = UniqueId::new().unwrap_or_else(|e| panic!("unique id: {}", e));
    let me = std::env::current_exe().expect("this program");
    let children: Vec<_> = (0..nranks)
        .map(|r| Command::new(&me).args([nranks.to_string(), r.to_string(), hex(&id.to_bytes())]).spawn().unwrap())
        .collect();
    // Wait for every rank (a failed one leaves the others to their timeout).
    let statuses: Vec<bool> = children.into_iter().map(|mut c| c.wait().map(|s| s.success()).unwrap_or(false)).collect();
    let ok = statuses.iter().all(|&s| s);
    println!("moeep-example: {}", if ok { "every rank correct" } else { "FAILED" });
    exit(if ok { 0 } else { 1 });
}
