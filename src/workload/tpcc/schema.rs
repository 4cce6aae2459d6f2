//! The nine TPC-C tables (TPC-C v5.11 clause 1.3) over the Db API, plus a one-row table that
//! records the scale the database was loaded with.
//!
//! Columns have the spec's maximum sizes: text as fixed-length byte columns (zero-padded), ids and
//! counts as `U64`, money as `I64` cents and rates (tax, discount) as `I64` hundredths of a percent
//! (the spec's `signed numeric(4,4)`; 1 unit = 0.0001), so the consistency sums are exact.
//! A null `O_CARRIER_ID` or `OL_DELIVERY_D` is stored as 0 (no valid value is 0).
//!
//! Composite primary keys are packed into the engine's 8-byte key (see [`keys`](super::keys)).
//! The tables scanned by range (NEW-ORDER, ORDER, ORDER-LINE, HISTORY) have ordered primary
//! indexes; the others are hashed. CUSTOMER has a secondary index on
//! `(C_W_ID, C_D_ID, C_LAST)` (clause 2.5.2.2, 2.6.2.2) and ORDER one on `(O_W_ID, O_D_ID,
//! O_C_ID)` for Order-Status's "most recent order of the customer" (clause 2.6.2.2).

use crate::catalog::{ColumnType, Schema};

const fn b(n: u32) -> ColumnType {
    ColumnType::Bytes(n)
}
const U: ColumnType = ColumnType::U64;
const I: ColumnType = ColumnType::I64;

/// Table names, in creation order.
pub const TABLE_NAMES: [&str; 10] = [
    "tpcc_warehouse",
    "tpcc_district",
    "tpcc_customer",
    "tpcc_history",
    "tpcc_new_order",
    "tpcc_order",
    "tpcc_order_line",
    "tpcc_item",
    "tpcc_stock",
    "tpcc_meta",
];

/// WAREHOUSE column positions.
pub mod warehouse {
    /// W_ID.
    pub const ID: usize = 0;
    /// W_NAME.
    pub const NAME: usize = 1;
    /// W_STREET_1 (STREET_2, CITY, STATE, ZIP follow).
    pub const STREET_1: usize = 2;
    /// W_TAX.
    pub const TAX: usize = 7;
    /// W_YTD.
    pub const YTD: usize = 8;
}

/// DISTRICT column positions.
pub mod district {
    /// D_ID.
    pub const ID: usize = 0;
    /// D_W_ID.
    pub const W_ID: usize = 1;
    /// D_NAME.
    pub const NAME: usize = 2;
    /// D_STREET_1 (STREET_2, CITY, STATE, ZIP follow).
    pub const STREET_1: usize = 3;
    /// D_TAX.
    pub const TAX: usize = 8;
    /// D_YTD.
    pub const YTD: usize = 9;
    /// D_NEXT_O_ID.
    pub const NEXT_O_ID: usize = 10;
}

/// CUSTOMER column positions.
pub mod customer {
    /// C_ID.
    pub const ID: usize = 0;
    /// C_D_ID.
    pub const D_ID: usize = 1;
    /// C_W_ID.
    pub const W_ID: usize = 2;
    /// C_FIRST.
    pub const FIRST: usize = 3;
    /// C_MIDDLE.
    pub const MIDDLE: usize = 4;
    /// C_LAST.
    pub const LAST: usize = 5;
    /// C_STREET_1 (STREET_2, CITY, STATE, ZIP follow).
    pub const STREET_1: usize = 6;
    /// C_PHONE.
    pub const PHONE: usize = 11;
    /// C_SINCE.
    pub const SINCE: usize = 12;
    /// C_CREDIT ("GC" or "BC").
    pub const CREDIT: usize = 13;
    /// C_CREDIT_LIM.
    pub const CREDIT_LIM: usize = 14;
    /// C_DISCOUNT.
    pub const DISCOUNT: usize = 15;
    /// C_BALANCE.
    pub const BALANCE: usize = 16;
    /// C_YTD_PAYMENT.
    pub const YTD_PAYMENT: usize = 17;
    /// C_PAYMENT_CNT.
    pub const PAYMENT_CNT: usize = 18;
    /// C_DELIVERY_CNT.
    pub const DELIVERY_CNT: usize = 19;
    /// C_DATA.
    pub const DATA: usize = 20;
    /// Index of the `(C_W_ID, C_D_ID, C_LAST)` secondary index.
    pub const BY_LAST_NAME: usize = 0;
}

/// HISTORY column positions.
pub mod history {
    /// H_C_ID.
    pub const C_ID: usize = 0;
    /// H_C_D_ID.
    pub const C_D_ID: usize = 1;
    /// H_C_W_ID.
    pub const C_W_ID: usize = 2;
    /// H_D_ID.
    pub const D_ID: usize = 3;
    /// H_W_ID.
    pub const W_ID: usize = 4;
    /// H_DATE.
    pub const DATE: usize = 5;
    /// H_AMOUNT.
    pub const AMOUNT: usize = 6;
    /// H_DATA.
    pub const DATA: usize = 7;
}

/// NEW-ORDER column positions.
pub mod new_order {
    /// NO_O_ID.
    pub const O_ID: usize = 0;
    /// NO_D_ID.
    pub const D_ID: usize = 1;
    /// NO_W_ID.
    pub const W_ID: usize = 2;
}

/// ORDER column positions.
pub mod order {
    /// O_ID.
    pub const ID: usize = 0;
    /// O_D_ID.
    pub const D_ID: usize = 1;
    /// O_W_ID.
    pub const W_ID: usize = 2;
    /// O_C_ID.
    pub const C_ID: usize = 3;
    /// O_ENTRY_D.
    pub const ENTRY_D: usize = 4;
    /// O_CARRIER_ID (0 = null).
    pub const CARRIER_ID: usize = 5;
    /// O_OL_CNT.
    pub const OL_CNT: usize = 6;
    /// O_ALL_LOCAL.
    pub const ALL_LOCAL: usize = 7;
    /// Index of the `(O_W_ID, O_D_ID, O_C_ID)` secondary index.
    pub const BY_CUSTOMER: usize = 0;
}

/// ORDER-LINE column positions.
pub mod order_line {
    /// OL_O_ID.
    pub const O_ID: usize = 0;
    /// OL_D_ID.
    pub const D_ID: usize = 1;
    /// OL_W_ID.
    pub const W_ID: usize = 2;
    /// OL_NUMBER.
    pub const NUMBER: usize = 3;
    /// OL_I_ID.
    pub const I_ID: usize = 4;
    /// OL_SUPPLY_W_ID.
    pub const SUPPLY_W_ID: usize = 5;
    /// OL_DELIVERY_D (0 = null).
    pub const DELIVERY_D: usize = 6;
    /// OL_QUANTITY.
    pub const QUANTITY: usize = 7;
    /// OL_AMOUNT.
    pub const AMOUNT: usize = 8;
    /// OL_DIST_INFO.
    pub const DIST_INFO: usize = 9;
}

/// ITEM column positions.
pub mod item {
    /// I_ID.
    pub const ID: usize = 0;
    /// I_IM_ID.
    pub const IM_ID: usize = 1;
    /// I_NAME.
    pub const NAME: usize = 2;
    /// I_PRICE.
    pub const PRICE: usize = 3;
    /// I_DATA.
    pub const DATA: usize = 4;
}

/// STOCK column positions.
pub mod stock {
    /// Bytes of each S_DIST_xx column (and of OL_DIST_INFO, copied from one).
    pub const DIST_BYTES: usize = 24;
    /// S_I_ID.
    pub const I_ID: usize = 0;
    /// S_W_ID.
    pub const W_ID: usize = 1;
    /// S_QUANTITY.
    pub const QUANTITY: usize = 2;
    /// S_DIST_01; S_DIST_02..S_DIST_10 follow.
    pub const DIST_01: usize = 3;
    /// S_YTD.
    pub const YTD: usize = 13;
    /// S_ORDER_CNT.
    pub const ORDER_CNT: usize = 14;
    /// S_REMOTE_CNT.
    pub const REMOTE_CNT: usize = 15;
    /// S_DATA.
    pub const DATA: usize = 16;
}

/// META column positions: the scale of the load (one row, key 0).
pub mod meta {
    /// Warehouses.
    pub const WAREHOUSES: usize = 0;
    /// Items.
    pub const ITEMS: usize = 1;
    /// Customers per district.
    pub const CUSTOMERS: usize = 2;
    /// Orders per district at load.
    pub const ORDERS: usize = 3;
    /// Undelivered (new) orders per district at load.
    pub const NEW_ORDERS: usize = 4;
    /// The load's NURand C for C_LAST (the run's must keep its distance to it).
    pub const C_LAST_LOAD: usize = 5;
    /// The load's NURand C for C_ID.
    pub const C_ID_LOAD: usize = 6;
    /// The load's NURand C for OL_I_ID.
    pub const OL_I_ID_LOAD: usize = 7;
}

const ADDRESS: [(&str, ColumnType); 5] = [
    ("street_1", b(20)),
    ("street_2", b(20)),
    ("city", b(20)),
    ("state", b(2)),
    ("zip", b(9)),
];

fn with_address(
    head: &[(&'static str, ColumnType)],
    tail: &[(&'static str, ColumnType)],
) -> Vec<(&'static str, ColumnType)> {
    head.iter()
        .chain(ADDRESS.iter())
        .chain(tail.iter())
        .copied()
        .collect()
}

/// The schemas of every table, in the order of [`TABLE_NAMES`].
pub fn schemas() -> Vec<Schema> {
    let warehouse = with_address(
        &[("w_id", U), ("w_name", b(10))],
        &[("w_tax", I), ("w_ytd", I)],
    );
    let district = with_address(
        &[("d_id", U), ("d_w_id", U), ("d_name", b(10))],
        &[("d_tax", I), ("d_ytd", I), ("d_next_o_id", U)],
    );
    let customer = with_address(
        &[
            ("c_id", U),
            ("c_d_id", U),
            ("c_w_id", U),
            ("c_first", b(16)),
            ("c_middle", b(2)),
            ("c_last", b(16)),
        ],
        &[
            ("c_phone", b(16)),
            ("c_since", U),
            ("c_credit", b(2)),
            ("c_credit_lim", I),
            ("c_discount", I),
            ("c_balance", I),
            ("c_ytd_payment", I),
            ("c_payment_cnt", U),
            ("c_delivery_cnt", U),
            ("c_data", b(500)),
        ],
    );
    let history = [
        ("h_c_id", U),
        ("h_c_d_id", U),
        ("h_c_w_id", U),
        ("h_d_id", U),
        ("h_w_id", U),
        ("h_date", U),
        ("h_amount", I),
        ("h_data", b(24)),
    ];
    let new_order = [("no_o_id", U), ("no_d_id", U), ("no_w_id", U)];
    let order = [
        ("o_id", U),
        ("o_d_id", U),
        ("o_w_id", U),
        ("o_c_id", U),
        ("o_entry_d", U),
        ("o_carrier_id", U),
        ("o_ol_cnt", U),
        ("o_all_local", U),
    ];
    let order_line = [
        ("ol_o_id", U),
        ("ol_d_id", U),
        ("ol_w_id", U),
        ("ol_number", U),
        ("ol_i_id", U),
        ("ol_supply_w_id", U),
        ("ol_delivery_d", U),
        ("ol_quantity", U),
        ("ol_amount", I),
        ("ol_dist_info", b(stock::DIST_BYTES as u32)),
    ];
    let item = [
        ("i_id", U),
        ("i_im_id", U),
        ("i_name", b(24)),
        ("i_price", I),
        ("i_data", b(50)),
    ];
    let dist_names = [
        "s_dist_01",
        "s_dist_02",
        "s_dist_03",
        "s_dist_04",
        "s_dist_05",
        "s_dist_06",
        "s_dist_07",
        "s_dist_08",
        "s_dist_09",
        "s_dist_10",
    ];
    let mut stock = vec![("s_i_id", U), ("s_w_id", U), ("s_quantity", I)];
    stock.extend(dist_names.iter().map(|n| (*n, b(stock::DIST_BYTES as u32))));
    stock.extend([
        ("s_ytd", U),
        ("s_order_cnt", U),
        ("s_remote_cnt", U),
        ("s_data", b(50)),
    ]);
    let meta = [
        ("warehouses", U),
        ("items", U),
        ("customers_per_district", U),
        ("orders_per_district", U),
        ("new_orders_per_district", U),
        ("c_last_load", U),
        ("c_id_load", U),
        ("ol_i_id_load", U),
    ];
    vec![
        Schema::new(TABLE_NAMES[0], &warehouse),
        Schema::new(TABLE_NAMES[1], &district),
        Schema::new(TABLE_NAMES[2], &customer)
            .with_secondary("customer_by_last_name", &["c_w_id", "c_d_id", "c_last"]),
        Schema::new(TABLE_NAMES[3], &history).ordered(),
        Schema::new(TABLE_NAMES[4], &new_order).ordered(),
        Schema::new(TABLE_NAMES[5], &order)
            .ordered()
            .with_secondary("order_by_customer", &["o_w_id", "o_d_id", "o_c_id"]),
        Schema::new(TABLE_NAMES[6], &order_line).ordered(),
        Schema::new(TABLE_NAMES[7], &item),
        Schema::new(TABLE_NAMES[8], &stock),
        Schema::new(TABLE_NAMES[9], &meta),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_positions_match_the_schemas() {
        let s = schemas();
        let pos = |t: usize, name: &str| s[t].column_index(name).unwrap();
        assert_eq!(pos(0, "w_tax"), warehouse::TAX);
        assert_eq!(pos(0, "w_ytd"), warehouse::YTD);
        assert_eq!(pos(1, "d_next_o_id"), district::NEXT_O_ID);
        assert_eq!(pos(2, "c_last"), customer::LAST);
        assert_eq!(pos(2, "c_phone"), customer::PHONE);
        assert_eq!(pos(2, "c_data"), customer::DATA);
        assert_eq!(pos(2, "c_delivery_cnt"), customer::DELIVERY_CNT);
        assert_eq!(pos(3, "h_data"), history::DATA);
        assert_eq!(pos(5, "o_all_local"), order::ALL_LOCAL);
        assert_eq!(pos(6, "ol_dist_info"), order_line::DIST_INFO);
        assert_eq!(pos(7, "i_data"), item::DATA);
        assert_eq!(pos(8, "s_dist_01"), stock::DIST_01);
        assert_eq!(pos(8, "s_ytd"), stock::YTD);
        assert_eq!(pos(8, "s_data"), stock::DATA);
        for schema in &s {
            schema.validate(4096).unwrap();
        }
        // Row sizes close to the spec's (clause 1.3), with 8-byte numbers.
        assert_eq!(s[2].row_size(), 8 * 10 + 16 + 2 + 16 + 71 + 16 + 2 + 500);
    }
}
