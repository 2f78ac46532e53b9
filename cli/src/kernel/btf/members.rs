//! Struct members: the byte offset and size of `task_struct.sched_info.run_delay` and the like,
//! nested and anonymous members included (how kernel struct offsets reach the BPF programs).

use super::{Btf, BtfError, Member, KIND_STRUCT, KIND_UNION};

impl Btf {
    /// Id of the struct named `name` (the first with members, skipping empty declarations).
    pub fn find_struct(&self, name: &str) -> Option<u32> {
        Some(self.find_kind(KIND_STRUCT, &[name], true)[0]).filter(|&id| id != 0)
    }

    /// Searches the members of struct/union `id` for `name`, descending into anonymous
    /// structs and unions. Returns (bit offset from the start of `id`, member type, bitfield).
    fn member_in(&self, id: u32, name: &[u8], depth: u32) -> Option<(u32, u32, bool)> {
        if depth > 8 {
            return None;
        }
        let (_, kind, kflag, vlen, _, at) = self.ty(self.resolve(id))?;
        if kind != KIND_STRUCT && kind != KIND_UNION {
            return None;
        }
        for i in 0..vlen {
            let m = at + 12 + 12 * i;
            let (mname, mtype, moff) = (
                self.u32_at(m).ok()?,
                self.u32_at(m + 4).ok()?,
                self.u32_at(m + 8).ok()?,
            );
            let (bit_off, bitfield) = if kflag {
                (moff & 0xff_ffff, moff >> 24 != 0)
            } else {
                (moff, false)
            };
            if mname == 0 {
                if let Some((o, t, b)) = self.member_in(mtype, name, depth + 1) {
                    return Some((bit_off + o, t, b));
                }
            } else if self.str_at(mname) == name {
                return Some((bit_off, mtype, bitfield));
            }
        }
        None
    }

    /// Byte offset and size of `path` (members separated by dots) inside struct `strukt`.
    pub fn member(&self, strukt: &str, path: &str) -> Result<Member, BtfError> {
        let mut id = self
            .find_struct(strukt)
            .ok_or_else(|| BtfError::NoStruct(strukt.to_string()))?;
        let mut bits = 0u32;
        for part in path.split('.') {
            let (o, t, bitfield) =
                self.member_in(id, part.as_bytes(), 0)
                    .ok_or_else(|| BtfError::NoMember {
                        strukt: strukt.to_string(),
                        member: path.to_string(),
                    })?;
            if bitfield || o % 8 != 0 {
                return Err(BtfError::Bitfield {
                    strukt: strukt.to_string(),
                    member: path.to_string(),
                });
            }
            bits += o;
            id = t;
        }
        Ok(Member {
            offset: bits / 8,
            size: self.size_of(id),
        })
    }

    /// Byte offset of `strukt.path`, checked to be `size` bytes wide (what a program reads
    /// there): another width is a kernel whose `strukt` the tool does not support.
    pub fn member_offset(&self, strukt: &str, path: &str, size: u32) -> crate::error::Result<u32> {
        let m = self.member(strukt, path)?;
        if m.size != size {
            return Err(crate::error::Error::KernelFeature(format!(
                "kernel BTF: {strukt}.{path} is {} bytes, expected {size}: this kernel's {strukt} is not supported",
                m.size
            )));
        }
        Ok(m.offset)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::{fixture::fixture, VMLINUX};
    use super::*;

    #[test]
    fn finds_members_nested_anonymous_and_typedefed() {
        let btf = Btf::parse(fixture(), "fixture").unwrap();
        assert_eq!(btf.len(), 14);
        let m = |p: &str| btf.member("task_struct", p).unwrap();
        assert_eq!(
            m("pid"),
            Member {
                offset: 112,
                size: 4
            }
        );
        assert_eq!(
            m("tgid"),
            Member {
                offset: 116,
                size: 4
            }
        );
        assert_eq!(
            m("nvcsw"),
            Member {
                offset: 120,
                size: 8
            }
        );
        assert_eq!(
            m("nivcsw"),
            Member {
                offset: 128,
                size: 8
            }
        );
        assert_eq!(
            m("sched_info.run_delay"),
            Member {
                offset: 88,
                size: 8
            }
        );
        assert_eq!(
            m("se.nr_migrations"),
            Member {
                offset: 56,
                size: 8
            }
        );
        assert_eq!(
            m("comm"),
            Member {
                offset: 136,
                size: 16
            }
        );
    }

    #[test]
    fn errors_name_what_is_missing() {
        let btf = Btf::parse(fixture(), "fixture").unwrap();
        let e = btf.member("task_struct", "start_time").unwrap_err();
        assert_eq!(
            e.to_string(),
            "kernel BTF: struct task_struct has no member start_time"
        );
        assert!(matches!(
            btf.member("task_struct", "flags"),
            Err(BtfError::Bitfield { .. })
        ));
        assert!(matches!(
            btf.member("mm_struct", "pgd"),
            Err(BtfError::NoStruct(_))
        ));
        assert!(matches!(
            btf.member("task_struct", "se.nope"),
            Err(BtfError::NoMember { .. })
        ));
    }

    #[test]
    fn member_offset_checks_the_width() {
        let btf = Btf::parse(fixture(), "fixture").unwrap();
        assert_eq!(btf.member_offset("task_struct", "tgid", 4).unwrap(), 116);
        let e = btf.member_offset("task_struct", "nvcsw", 4).unwrap_err();
        assert_eq!(
            e.to_string(),
            "kernel BTF: task_struct.nvcsw is 8 bytes, expected 4: this kernel's task_struct is not supported"
        );
        assert_eq!(e.exit(), crate::error::Exit::KernelFeature);
        assert!(btf.member_offset("task_struct", "start_time", 8).is_err());
    }

    /// The running kernel's BTF, when there is one (not a fixture: a smoke check of scale).
    #[test]
    fn reads_this_kernel_if_present() {
        if !Path::new(VMLINUX).exists() {
            return;
        }
        let btf = Btf::from_sys_fs().unwrap();
        let pid = btf.member("task_struct", "pid").unwrap();
        let tgid = btf.member("task_struct", "tgid").unwrap();
        assert_eq!((pid.size, tgid.size), (4, 4));
        assert_eq!(tgid.offset, pid.offset + 4);
        assert_eq!(btf.member("task_struct", "nvcsw").unwrap().size, 8);
        assert_eq!(
            btf.member("task_struct", "sched_info.run_delay")
                .unwrap()
                .size,
            8
        );
    }
}
