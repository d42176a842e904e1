"""meshshard.shardtensor"""
