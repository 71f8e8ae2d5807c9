//! A BPF_PROG_TYPE_CGROUP_DEVICE program on a cgroup2 node: the kernel runs it on every
//! open and mknod of a device node by a process in that cgroup (or below) and denies
//! what it returns 0 for. Attached with BPF_F_ALLOW_MULTI, it runs beside whatever the
//! cgroups above have (a container runtime's allow-list, systemd's DevicePolicy), and
//! all must allow; it stays attached after its fd closes, until the cgroup is removed.
//!
//! Written by hand with `libc`: a dozen instructions and two bpf(2) calls. youki's
//! libcgroups (feature `cgroupsv2_devices`) was evaluated and not taken: it builds
//! libbpf from C through libbpf-sys (libelf headers, a system package absent here),
//! brings nix, pathrs and rbpf, and its `apply_devices` detaches the programs it finds on
//! the cgroup to install a runc-style allow-list, where gpupin adds a deny-list.

use super::{ConfineError, DeviceRules};
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

// linux/bpf.h
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
const BPF_CGROUP_DEVICE: u32 = 6;
const BPF_F_ALLOW_MULTI: u32 = 2;
/// `bpf_cgroup_dev_ctx.access_type`'s low 16 bits (the high ones are the access).
const BPF_DEVCG_DEV_CHAR: i32 = 2;

// Opcodes: class | op | source (linux/bpf_common.h, linux/bpf.h).
const LDX_MEM_W: u8 = 0x61; // BPF_LDX | BPF_MEM | BPF_W
const ALU32_AND_K: u8 = 0x54; // BPF_ALU | BPF_AND | BPF_K
const JMP32_JEQ_K: u8 = 0x16; // BPF_JMP32 | BPF_JEQ | BPF_K
const JMP32_JNE_K: u8 = 0x56; // BPF_JMP32 | BPF_JNE | BPF_K
const ALU64_MOV_K: u8 = 0xb7; // BPF_ALU64 | BPF_MOV | BPF_K
const JMP_EXIT: u8 = 0x95; // BPF_JMP | BPF_EXIT

/// struct bpf_insn: dst register in the low nibble of `regs`, src in the high one.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Insn {
    pub code: u8,
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | dst,
        off,
        imm,
    }
}

/// Loads the program for `rules` and attaches it to the cgroup `dir`.
pub(super) fn attach(dir: &Path, rules: &DeviceRules) -> Result<(), ConfineError> {
    let cgroup = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)
        .map_err(|source| ConfineError::OpenCgroup {
            path: dir.to_owned(),
            source,
        })?;
    let program = load(&program(rules)).map_err(|error| ConfineError::BpfLoad {
        path: dir.to_owned(),
        error,
    })?;
    // The attachment holds the program: `program` may close when this returns.
    attach_to(&cgroup, &program).map_err(|error| ConfineError::BpfAttach {
        path: dir.to_owned(),
        error,
    })
}

/// Denies char devices with a denied (major, minor): the other GPUs' nodes and the other
/// MIG instances' capability nodes; allows everything else. 32-bit compares (JMP32,
/// Linux 5.1) match the u32 fields exactly, whatever the value.
pub(super) fn program(rules: &DeviceRules) -> Vec<Insn> {
    let denied = rules.denied_nodes();
    // r1 = struct bpf_cgroup_dev_ctx { u32 access_type; u32 major; u32 minor; }
    // r3 = major, r2 = minor; each denied node is two compares: a major that differs
    // skips its minor's compare.
    let allow = 5 + 2 * denied.len(); // index of the allow exit
    let to = |from: usize, target: usize| (target - from - 1) as i16;
    let mut prog = vec![
        insn(LDX_MEM_W, 2, 1, 0, 0),
        insn(ALU32_AND_K, 2, 0, 0, 0xffff),
        insn(JMP32_JNE_K, 2, 0, to(2, allow), BPF_DEVCG_DEV_CHAR),
        insn(LDX_MEM_W, 3, 1, 4, 0),
        insn(LDX_MEM_W, 2, 1, 8, 0),
    ];
    for (i, &(major, minor)) in denied.iter().enumerate() {
        let at = 5 + 2 * i;
        prog.push(insn(JMP32_JNE_K, 3, 0, 1, major as i32));
        prog.push(insn(JMP32_JEQ_K, 2, 0, to(at + 1, allow + 2), minor as i32));
    }
    prog.extend([
        insn(ALU64_MOV_K, 0, 0, 0, 1),
        insn(JMP_EXIT, 0, 0, 0, 0),
        insn(ALU64_MOV_K, 0, 0, 0, 0),
        insn(JMP_EXIT, 0, 0, 0, 0),
    ]);
    prog
}

/// The BPF_PROG_LOAD part of union bpf_attr, up to `expected_attach_type`; the kernel
/// takes a shorter attr than its own (the rest reads as zero).
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// The BPF_PROG_ATTACH part of union bpf_attr.
#[repr(C)]
#[derive(Default)]
struct ProgAttachAttr {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
    replace_bpf_fd: u32,
}

fn load(prog: &[Insn]) -> io::Result<OwnedFd> {
    // No helper is called, so the license gates nothing.
    let license = c"GPL";
    let mut name = [0u8; 16];
    name[..10].copy_from_slice(b"gpupin_dev");
    let attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_CGROUP_DEVICE,
        insn_cnt: prog.len() as u32,
        insns: prog.as_ptr() as u64,
        license: license.as_ptr() as u64,
        prog_name: name,
        expected_attach_type: BPF_CGROUP_DEVICE,
        ..ProgLoadAttr::default()
    };
    let fd = bpf(BPF_PROG_LOAD, &attr)?;
    // SAFETY: a successful BPF_PROG_LOAD returns a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn attach_to(cgroup: &impl AsRawFd, prog: &OwnedFd) -> io::Result<()> {
    let attr = ProgAttachAttr {
        target_fd: cgroup.as_raw_fd() as u32,
        attach_bpf_fd: prog.as_raw_fd() as u32,
        attach_type: BPF_CGROUP_DEVICE,
        attach_flags: BPF_F_ALLOW_MULTI,
        ..ProgAttachAttr::default()
    };
    bpf(BPF_PROG_ATTACH, &attr).map(drop)
}

fn bpf<T>(cmd: libc::c_long, attr: &T) -> io::Result<i32> {
    // SAFETY: `attr` is a live, initialised repr(C) prefix of union bpf_attr of the
    // size passed; the pointers inside it (instructions, license) outlive the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *const T,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as i32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `prog` on a device access the way the kernel would, for the few opcodes
    /// `program` emits: true when it allows.
    fn run(prog: &[Insn], kind: u32, major: u32, minor: u32) -> bool {
        let ctx = [kind | (3 << 16), major, minor]; // access: read | write
        let mut regs = [0u64; 11];
        let mut pc = 0usize;
        loop {
            let i = prog[pc];
            let (dst, src) = ((i.regs & 0xf) as usize, (i.regs >> 4) as usize);
            let jump = |taken: bool| if taken { i.off as isize } else { 0 };
            let mut next = pc as isize + 1;
            match i.code {
                LDX_MEM_W => {
                    assert_eq!(src, 1, "loads come from the context");
                    regs[dst] = u64::from(ctx[i.off as usize / 4]);
                }
                ALU32_AND_K => regs[dst] = u64::from(regs[dst] as u32 & i.imm as u32),
                JMP32_JEQ_K => next += jump(regs[dst] as u32 == i.imm as u32),
                JMP32_JNE_K => next += jump(regs[dst] as u32 != i.imm as u32),
                ALU64_MOV_K => regs[dst] = i.imm as i64 as u64,
                JMP_EXIT => return regs[0] == 1,
                other => panic!("unexpected opcode {other:#x}"),
            }
            pc = usize::try_from(next).expect("jumps stay in the program");
        }
    }

    const CHAR: u32 = 2;
    const BLOCK: u32 = 1;

    #[test]
    fn denies_exactly_the_other_gpus_char_nodes() {
        let rules = DeviceRules::deny(195, [1, 3, 0x8000_0001]);
        let prog = program(&rules);
        assert!(!run(&prog, CHAR, 195, 1));
        assert!(!run(&prog, CHAR, 195, 3));
        assert!(!run(&prog, CHAR, 195, 0x8000_0001), "compares are 32-bit");
        assert!(run(&prog, CHAR, 195, 0), "its own GPU");
        assert!(run(&prog, CHAR, 195, 255), "nvidiactl");
        assert!(run(&prog, CHAR, 1, 3), "/dev/null");
        assert!(run(&prog, BLOCK, 195, 3), "a block device is another node");
    }

    #[test]
    fn denies_the_other_mig_instances_capability_nodes_by_their_own_major() {
        // A job on GPU 0's instance with caps 84 and 85: GPU 1 and the other instances'
        // caps are denied; its own caps, and GPU minors equal to a denied cap, are not.
        let rules = DeviceRules::deny(195, [1]).with_caps(237, [21, 22, 93, 94]);
        let prog = program(&rules);
        assert!(!run(&prog, CHAR, 195, 1));
        assert!(!run(&prog, CHAR, 237, 21));
        assert!(!run(&prog, CHAR, 237, 94));
        assert!(run(&prog, CHAR, 237, 84), "its own GI's cap");
        assert!(run(&prog, CHAR, 237, 85), "its own CI's cap");
        assert!(run(&prog, CHAR, 195, 0), "its own GPU");
        assert!(run(&prog, CHAR, 195, 21), "a GPU minor is not a cap minor");
        assert!(run(&prog, CHAR, 237, 1), "a cap minor is not a GPU minor");
    }

    #[test]
    fn no_denied_minor_allows_everything() {
        let prog = program(&DeviceRules::deny(195, []));
        assert!(run(&prog, CHAR, 195, 3));
        assert!(run(&prog, BLOCK, 8, 0));
    }

    #[test]
    fn the_attr_prefixes_have_the_kernels_layout() {
        assert_eq!(std::mem::size_of::<Insn>(), 8);
        assert_eq!(std::mem::size_of::<ProgLoadAttr>(), 72);
        assert_eq!(std::mem::size_of::<ProgAttachAttr>(), 20);
    }
}
