//! Address handles and address vectors: `CMD_CREATE_AH`,
//! `CMD_DESTROY_AH` (`ibv_create_ah(3)`), and the address vector check
//! `CMD_MODIFY_QP` shares.

use super::*;
use crate::verbs::ah::{Ah, Av};

impl Device {
    /// Checks an address vector against the GID table: the source GID
    /// index must exist and be of the destination's family (IPv4-mapped
    /// GIDs for IPv4, the others for IPv6), as the kernel's RoCE
    /// `ib_resolve_eth_dmac` requires; the destination must be a unicast
    /// address.
    pub(super) fn check_av(&self, av: &Av) -> Result<(), CommandError> {
        let sgid = self
            .gid(av.sgid_index as u32)
            .ok_or(CommandError::invalid("source GID index"))?;
        let dst = Gid(av.dgid).to_ip();
        if sgid.to_ip().is_ipv4() != dst.is_ipv4() {
            return Err(CommandError::invalid(
                "destination GID (not of the source GID's family)",
            ));
        }
        if dst.is_unspecified() || dst.is_multicast() {
            return Err(CommandError::invalid("destination GID (not unicast)"));
        }
        Ok(())
    }

    /// `CMD_CREATE_AH` at time `now`: a global (GRH) address on port 1;
    /// its destination's resolution starts at once, so the first send
    /// does not wait for ARP.
    pub(super) fn create_ah(
        &mut self,
        ctx: u16,
        c: abi::CreateAh,
        now: Nanos,
    ) -> Result<abi::Handle, CommandError> {
        if !self.owns_pd(ctx, c.pdn) {
            return Err(CommandError::NotFound(Object::Pd(c.pdn)));
        }
        if c.port_num != 1 {
            return Err(CommandError::invalid("port number"));
        }
        if c.is_global == 0 {
            // A RoCEv2 address is an IP address, carried in the GRH.
            return Err(CommandError::invalid("AH without a GRH"));
        }
        let av = Av::of_ah(&c);
        self.check_av(&av)?;
        if self.res.ahs.len() >= MAX_AH {
            return Err(CommandError::no_resources("AHs"));
        }
        let ahn = self
            .res
            .ahs
            .insert_with(0, |ahn| Ah {
                ahn,
                pdn: c.pdn,
                av,
            })
            .ok_or(CommandError::no_resources("AH numbers"))?;
        self.resolve(av.dgid, now);
        Ok(handle_of(ahn))
    }

    /// `CMD_DESTROY_AH` of AH `ahn`.
    pub(super) fn destroy_ah(&mut self, ctx: u16, ahn: u32) -> Result<(), CommandError> {
        if !self.owns_ah(ctx, ahn) {
            return Err(CommandError::NotFound(Object::Ah(ahn)));
        }
        self.res
            .ahs
            .remove(ahn)
            .ok_or(CommandError::NotFound(Object::Ah(ahn)))?;
        Ok(())
    }
}
